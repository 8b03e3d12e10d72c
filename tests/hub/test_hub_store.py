"""The local store: ``python -m llamapy pull|list|rm|show`` against the Hub stand-in, names and
aliases, shared cache files, nothing half written after a failure, and ``--models-dir``
serving what was pulled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hub_standin import TINY, HubStandin, Repo, blobs, tiny_files

from llamapy.__main__ import main
from llamapy.errors import InvalidOptionError, StoreEntryNotFoundError
from llamapy.hub.fetch import HubAccess
from llamapy.hub.store import ModelStore
from llamapy.options.hub import parse_model_ref
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.start import start_options
from llamapy.serve.models_specs import build_manager


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def store_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file())


def test_pull_list_show_rm(hub: HubStandin, hub_env: Path, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "pull", f"hf.co/{TINY}:q8_0", "--alias", "tiny")
    assert code == 0 and f"hf.co/{TINY}:Q8_0" in out
    other = str(tmp_path / "other")
    assert run(capsys, "list", "--models-dir", other)[1].count("\n") == 1  # another store
    assert run(capsys, "pull", f"{TINY}:F16", "--models-dir", other)[0] == 0
    assert "F16" in run(capsys, "list", "--models-dir", other)[1]
    assert "F16" not in run(capsys, "list")[1]
    code, out, _ = run(capsys, "list")
    header, row = out.splitlines()
    assert header.split() == ["NAME", "SIZE", "DIGEST", "MODIFIED"]
    assert row.startswith(f"hf.co/{TINY}:Q8_0, tiny") and "2.1 KB" in row
    shown = json.loads(run(capsys, "show", "tiny")[1])
    assert shown["repo"] == TINY and shown["files"] == ["tiny-Q8_0.gguf"]
    assert Path(shown["path"]).read_bytes() == tiny_files()["tiny-Q8_0.gguf"]
    assert len(shown["digest"]) == 64
    code, out, _ = run(capsys, "rm", f"{TINY}:Q8_0")
    assert code == 0 and not Path(shown["path"]).exists()
    assert len(blobs(hub_env)) == 2  # only the other store's two F16 parts are left
    assert run(capsys, "list")[1].splitlines() == ["NAME  SIZE  DIGEST  MODIFIED"]
    code, _, err = run(capsys, "show", "tiny")
    assert code == 1 and err.startswith("error: no model 'tiny' in the store")


def test_rm_keeps_cache_files_another_model_uses(hub: HubStandin, hub_env: Path) -> None:
    store, access = ModelStore(), HubAccess.from_env()
    latest = store.pull(parse_model_ref(TINY), access)  # the default tag: Q4_K_M
    tagged = store.pull(parse_model_ref(f"{TINY}:Q4_K_M"), access)
    assert latest.name.endswith(":latest") and latest.paths == tagged.paths
    store.remove(latest.name)
    assert tagged.path.is_file() and [e.name for e in store.entries()] == [tagged.name]
    store.remove(tagged.name)
    assert not tagged.path.exists() and blobs(hub_env) == []


def test_a_failed_pull_leaves_the_store_as_it_was(hub_env: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    repo = Repo(tiny_files(), corrupt={"tiny-Q8_0.gguf"})
    with HubStandin({TINY: repo}) as standin:
        monkeypatch.setenv("HF_ENDPOINT", standin.url)
        assert run(capsys, "pull", f"{TINY}:Q4_K_M")[0] == 0
        before = store_files(tmp_path / "store")
        for name in (f"{TINY}:Q8_0", "org/absent", f"{TINY}:Q2_K"):
            code, _, err = run(capsys, "pull", name)
            assert code == 1 and err.startswith("error: ")
    assert store_files(tmp_path / "store") == before  # no manifest, no temporary file
    assert len(blobs(hub_env)) == 1


@pytest.mark.parametrize("argv", [["pull", "org/repo:"], ["pull", "not a name"],
                                  ["pull", TINY, "--alias", "bad alias"],
                                  ["pull", TINY, "--hf-token", "a b"]])
def test_bad_store_arguments_are_typed_errors(hub_env: Path, argv: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 1 and err.startswith("error: ")


def test_an_alias_names_one_model_only(hub: HubStandin) -> None:
    store, access = ModelStore(), HubAccess.from_env()
    store.pull(parse_model_ref(f"{TINY}:Q8_0"), access, ("tiny",))
    with pytest.raises(InvalidOptionError, match="already names"):
        store.pull(parse_model_ref(f"{TINY}:Q4_K_M"), access, ("tiny",))
    with pytest.raises(StoreEntryNotFoundError):
        store.find("other")


def test_offline_pull_records_a_cached_model(hub: HubStandin,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "pull", f"{TINY}:Q8_0")[0] == 0
    assert run(capsys, "rm", f"{TINY}:Q8_0")[0] == 0  # the files go with it
    assert run(capsys, "pull", f"{TINY}:F16")[0] == 0
    hub.stop()
    code, _, _ = run(capsys, "pull", f"{TINY}:F16", "--alias", "half", "--offline")
    assert code == 0 and "half" in run(capsys, "list")[1]


def test_models_dir_serves_pulled_models_by_name_and_alias(hub: HubStandin,
                                                           tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    entry = store.pull(parse_model_ref(f"{TINY}:Q8_0"), HubAccess.from_env(), ("tiny",))
    latest = store.pull(parse_model_ref(TINY), HubAccess.from_env())
    (tmp_path / "store" / "local.gguf").write_bytes(b"x")
    args = build_parser().parse_args(["--models-dir", str(tmp_path / "store")])
    manager, _ = build_manager(args, start_options(args))
    with manager:
        assert manager.names == ["local", entry.name, latest.name]
        assert manager.resolve("tiny") == entry.name
        assert manager.spec("tiny").path == entry.path
        assert manager.resolve(f"hf.co/{TINY}") == latest.name  # Ollama's untagged name
