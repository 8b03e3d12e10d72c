"""The typed keyword options: ``GenerationOptions`` and ``DecodeFields`` follow the option tree.

The checked-in modules equal what their generators render from the tree now (keys, types,
comments); every call option and alias is a key, with its target's type; and mypy, reading
``Server``'s and ``Session``'s own signatures (``**options: Unpack[GenerationOptions]``,
``**fields: Unpack[DecodeFields]``, sync and async), accepts good calls and refuses a misspelt
option and a value of the wrong type.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import get_type_hints

import pytest

from llamapy.options import ALIASES, GenerationOptions, call_option_keys
from llamapy.options import _typed_gen as typed_gen
from llamapy.session import _fields_gen as fields_gen
from llamapy.session.config import DecodeConfig
from llamapy.session.fields import DecodeFields

ROOT = Path(__file__).resolve().parents[1]


def test_generation_options_module_is_generated_from_the_tree() -> None:
    path = ROOT / "llamapy" / "options" / "typed.py"
    assert path.read_text() == typed_gen.render(), (
        "llamapy/options/typed.py is stale: run python -m llamapy.options._typed_gen")


def test_decode_fields_module_is_generated_from_decode_config() -> None:
    path = ROOT / "llamapy" / "session" / "fields.py"
    assert path.read_text() == fields_gen.render(), (
        "llamapy/session/fields.py is stale: run python -m llamapy.session._fields_gen")


def test_generation_options_keys_are_the_call_options_and_their_aliases() -> None:
    assert set(GenerationOptions.__optional_keys__) == set(call_option_keys()) | set(ALIASES)
    assert not GenerationOptions.__required_keys__


def test_an_alias_has_its_targets_type() -> None:
    hints = get_type_hints(GenerationOptions)
    for alias, target in ALIASES.items():
        assert hints[alias] == hints[target], alias


def test_generation_options_types_are_the_fields_input_types() -> None:
    hints = get_type_hints(GenerationOptions)
    assert hints["temp"] is float and hints["max_tokens"] is int
    assert hints["stop"] == str | Sequence[str]  # accepts wider than it stores
    assert hints["timeout"] == float | None


def test_decode_fields_are_decode_configs_fields() -> None:
    names = [f.name for f in dataclasses.fields(DecodeConfig)]
    assert list(get_type_hints(DecodeFields)) == names
    assert set(DecodeFields.__optional_keys__) == set(names)


SNIPPET = """
from llamapy import Server, Session


def use(server: Server, session: Session) -> None:
    server.generate("hi", temperature=0.5, temp=1, max_tokens=3, stop=["x"], timeout=None,
                    request_id=("a", 1), logit_bias={5: -1.5}, samplers="kt")
    session.decode(max_tokens=None, temperature=0.2)
    server.generate("hi", temperature="hot")  # bad: wrong type
    server.stream("hi", temprature=0.5)  # bad: unknown key
    session.decode(max_tokens="many")  # bad: wrong type


async def ause(server: Server, session: Session) -> None:
    await server.agenerate_tokens([1, 2], n_predict=4, cache_scope="t")
    session.adecode(top_k=3)
    await server.acomplete("hi", seed="x")  # bad: wrong type
    session.adecode(temp=0.3)  # bad: unknown key
"""


def test_mypy_checks_server_and_session_calls_against_their_options(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    api = pytest.importorskip("mypy.api")
    source = tmp_path / "snippet.py"
    text = textwrap.dedent(SNIPPET).lstrip()
    source.write_text(text)
    bad = [n for n, line in enumerate(text.splitlines(), 1) if "# bad:" in line]
    monkeypatch.setenv("MYPYPATH", str(ROOT))  # this checkout, not an installed llamapy
    out, err, status = api.run([
        "--cache-dir", str(tmp_path / "cache"), "--python-version", "3.10",
        "--no-error-summary", "--config-file", str(ROOT / "pyproject.toml"), str(source)])
    errors = {int(line.split(":")[1]): line for line in out.splitlines() if ": error:" in line}
    assert status == 1, out + err
    assert sorted(errors) == bad, out
    assert '"temperature"' in errors[bad[0]] and '"float"' in errors[bad[0]]
    assert "temprature" in errors[bad[1]]
    assert '"max_tokens"' in errors[bad[2]]
    assert '"seed"' in errors[bad[3]]
    assert '"temp"' in errors[bad[4]]
