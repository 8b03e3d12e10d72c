"""The several-models command line: --model repeatable with pairwise --alias, --models-dir,
--models-preset (TOML), --pin, the budget flags; and a real run of ``python -m llamapy.serve
--models-dir`` where the budget unloads, the next request reloads and a broken GGUF fails
alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from http_helpers import WAIT_S, free_port, poll

from llamapy.errors import InvalidOptionError, UnknownOptionError
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.models import serves_several
from llamapy.serve.flags.start import start_options
from llamapy.serve.models_specs import build_manager
from llamapy.server import ModelManager


def manager_for(*argv: str) -> tuple[ModelManager, dict[str, str]]:
    args = build_parser().parse_args(list(argv))
    assert serves_several(args)
    return build_manager(args, start_options(args))


def test_one_model_is_not_several() -> None:
    args = build_parser().parse_args(["-m", "x.gguf", "--alias", "a,b"])
    assert not serves_several(args) and args.model == ["x.gguf"]
    with_rule = build_parser().parse_args(["-m", "x.gguf", "--alias", "solo,alone",
                                           "--keep-alive", "0"])
    assert serves_several(with_rule)
    manager, _ = build_manager(with_rule, {})
    with manager:
        assert manager.names == ["solo"] and manager.keep_alive == 0
        assert manager.resolve("alone") == "solo"


def test_repeated_model_flags_pair_with_aliases() -> None:
    manager, _ = manager_for("-m", "/m/x.gguf", "-m", "/m/y.gguf", "--alias", "one",
                             "--alias", "two", "-c", "512", "--models-max", "1",
                             "--keep-alive", "5m", "--pin", "two")
    with manager:
        assert manager.names == ["one", "two"]
        assert manager.spec("one").options["n_ctx"] == 512
        assert manager.models_max == 1 and manager.keep_alive == 300
        assert [s.pinned for s in manager.status()] == [False, True]
    with pytest.raises(InvalidOptionError, match="one --alias per model"):
        manager_for("-m", "x.gguf", "-m", "y.gguf", "--alias", "one")
    with pytest.raises(InvalidOptionError, match="--pin"):
        manager_for("-m", "x.gguf", "-m", "y.gguf", "--pin", "z")


def test_models_dir_serves_every_gguf(tmp_path: Path) -> None:
    for name in ("b.gguf", "a.gguf", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    manager, _ = manager_for("--models-dir", str(tmp_path))
    with manager:
        assert manager.names == ["a", "b"]
    with pytest.raises(InvalidOptionError):
        manager_for("--models-dir", str(tmp_path / "missing"))


def test_preset_gives_per_model_options(tmp_path: Path) -> None:
    preset = tmp_path / "models.toml"
    preset.write_text('[models.smol]\npath = "smol.gguf"\naliases = ["small"]\n'
                      'keep_alive = 0\npinned = true\nmemory_mb = 200\n'
                      'chat_template = "chatml"\nn_ctx = 1024\nn_parallel = 2\n'
                      '[models.other]\npath = "/abs/other.gguf"\n', encoding="utf-8")
    manager, templates = manager_for("--models-preset", str(preset), "-c", "512")
    with manager:
        smol = manager.spec("small")
        assert smol.path == tmp_path / "smol.gguf"
        assert dict(smol.options) == {"n_ctx": 1024, "n_parallel": 2}
        assert manager.spec("other").options == {"n_ctx": 512}
        status = manager.status_of("smol")
        assert status.pinned and status.keep_alive == 0 and status.memory_mb == 200
        assert "im_start" in templates["smol"]
    preset.write_text('[models.bad]\npath = "x.gguf"\nn_bogus = 1\n', encoding="utf-8")
    with pytest.raises(UnknownOptionError):
        manager_for("--models-preset", str(preset))
    preset.write_text('[models.bad]\nn_ctx = 1\n', encoding="utf-8")
    with pytest.raises(InvalidOptionError, match="no path"):
        manager_for("--models-preset", str(preset))
    preset.write_text('[models\n', encoding="utf-8")
    with pytest.raises(InvalidOptionError):
        manager_for("--models-preset", str(preset))


def test_models_dir_command_line_serves(model_path: Path, tmp_path: Path) -> None:
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).symlink_to(model_path)
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    port = free_port()
    command = [sys.executable, "-m", "llamapy.serve", "--models-dir", str(tmp_path),
               "--models-max", "1", "-c", "512", "-np", "1", "-t", "1", "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            assert poll(http, "/health", 200).json() == {"status": "ok"}
            def ask(model: str) -> httpx.Response:
                return http.post("/v1/completions", json={"model": model, "prompt": "Hi",
                                                          "max_tokens": 3})

            assert ask("a").status_code == 200
            assert ask("b").status_code == 200
            states = {m["id"]: m["status"]["value"]
                      for m in http.get("/v1/models").json()["data"]}
            assert states == {"a": "unloaded", "b": "loaded", "broken": "unloaded"}
            assert ask("broken").status_code == 503
            assert ask("a").status_code == 200
    finally:
        process.terminate()
        process.wait(WAIT_S)
    assert process.returncode in (0, -15)
