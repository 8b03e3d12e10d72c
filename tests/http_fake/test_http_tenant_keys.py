"""API keys with tenants (:mod:`llamapy.serve.tenants`): the keys file's lines, good and bad,
the command line that reads it, and ``create_app``'s two ways of taking keys."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from llamapy.errors import InvalidOptionError
from llamapy.serve import create_app
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.compat import check_compat
from llamapy.serve.flags.serving import app_options
from llamapy.serve.tenants import OPEN, KeyTable, Principal
from llamapy.server.fake import fake_server

KEYS_FILE = """\
# tenants of the test server
ka acme
kb beta
kadm ops admin

kdef
"""


def test_a_keys_file_names_tenants_and_admins() -> None:
    table = KeyTable.parse(KEYS_FILE, plain=["kplain"])
    assert dict(table.entries) == {
        "kplain": Principal(None, False), "ka": Principal("acme", False),
        "kb": Principal("beta", False), "kadm": Principal("ops", True),
        "kdef": Principal(None, False)}
    assert table.tenancy and table.tenants == {"acme", "beta", "ops"}
    assert table.match(["nope", "kb"]) == Principal("beta", False)
    assert table.match(["nope", ""]) is None
    assert dict(KeyTable.parse("k0 - admin\n  # an indented comment\nk1 t1\n").entries) == {
        "k0": OPEN, "k1": Principal("t1", False)}


def test_keys_without_tenants_are_one_tenant_of_admins() -> None:
    table = KeyTable.parse("#c\nk1\n\nk2\nk1\n", plain=["k0", " "])
    assert dict(table.entries) == {"k0": OPEN, "k1": OPEN, "k2": OPEN}
    assert not table.tenancy and table.tenants == frozenset()
    assert dict(KeyTable.of_keys("a, b,").entries) == {"a": OPEN, "b": OPEN}


@pytest.mark.parametrize(("text", "message"), [
    ("k1 t1\nk2 t2 root\n", "keys line 2: expected 'KEY', 'KEY TENANT' or 'KEY TENANT admin'"),
    ("k1 t1 admin extra\n", "keys line 1: expected"),
    ("k1 a/b\n", "keys line 1: tenant 'a/b' is not a tenant name"),
    ("\nk1 .hidden\n", "keys line 2: tenant '.hidden'"),
    ("k1 " + "t" * 65 + "\n", "keys line 1: tenant 'ttt"),
    ("k1 caf\u00e9\n", "keys line 1: tenant 'caf\u00e9'"),
    ("k1 admin\n", "keys line 1: 'admin' is not a tenant name: write 'KEY TENANT admin'"),
    ("k1 admin admin\n", "keys line 1: 'admin' is not a tenant name"),
    ("k1 t1\n# c\nk1 t2\n", "keys line 3: the key is already given (keys line 1)"),
    ("k1 t1\nk1 t1 admin\n", "keys line 2: the key is already given"),
    ("k1\nk2 t2\nk1 t1\n", "keys line 3: the key is already given (keys line 1)"),
])
def test_a_bad_line_is_named_and_the_key_is_not(text: str, message: str) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        KeyTable.parse(text, source="keys")
    assert str(caught.value).startswith(message)
    assert "k1" not in str(caught.value) and "k2" not in str(caught.value)


def test_the_same_line_twice_is_one_entry() -> None:
    assert KeyTable.parse("k1 t1\nk1 t1\n").entries == (("k1", Principal("t1", False)),)


def test_a_table_built_in_code_is_checked_too() -> None:
    with pytest.raises(InvalidOptionError, match="not a tenant name"):
        KeyTable((("k", Principal("../up", False)),))
    with pytest.raises(InvalidOptionError, match="without blanks"):
        KeyTable((("k k", OPEN),))
    with pytest.raises(InvalidOptionError, match="another tenant or role"):
        KeyTable((("k", OPEN), ("k", Principal("t", False))))


def test_the_command_line_reads_the_keys_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("ka acme\nkadm ops admin\n", encoding="utf-8")
    args = build_parser().parse_args(["--api-key", "k0", "--api-key-file", str(keys)])
    check_compat(args)
    table = app_options(args)["api_keys"]
    assert dict(table.entries) == {"k0": Principal(None, False), "ka": Principal("acme", False),
                                   "kadm": Principal("ops", True)}
    keys.write_text("k1\nk2\n", encoding="utf-8")
    plain = app_options(build_parser().parse_args(["--api-key-file", str(keys)]))["api_keys"]
    assert dict(plain.entries) == {"k1": OPEN, "k2": OPEN}
    assert app_options(build_parser().parse_args([]))["api_keys"] is None
    keys.write_text("#only a comment\n", encoding="utf-8")
    assert app_options(build_parser().parse_args(["--api-key-file", str(keys)]))[
        "api_keys"] is None
    keys.write_text("k1 acme\nk2 no/slash\n", encoding="utf-8")
    with pytest.raises(InvalidOptionError, match=re.escape(f"{keys} line 2: tenant 'no/slash'")):
        check_compat(build_parser().parse_args(["--api-key-file", str(keys)]))


def test_api_key_and_api_keys_are_exclusive() -> None:
    server = fake_server()
    try:
        with pytest.raises(InvalidOptionError, match="not both"):
            create_app(server, api_key="k", api_keys=KeyTable.of_keys("k"))
    finally:
        server.close()


def test_a_table_pickles_for_ray_replicas() -> None:
    table = KeyTable.parse(KEYS_FILE)
    copy = pickle.loads(pickle.dumps(table))
    assert copy == table and copy.match(["kadm"]) == Principal("ops", True)
