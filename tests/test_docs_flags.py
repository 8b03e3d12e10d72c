"""The flag reference page (docs/reference/flags.md) is what its generator renders now: every
flag of ``python -m llamapy.serve``, with its spellings, variable, default and help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llamapy.serve import _docs_gen
from llamapy.serve.cli import build_parser


def test_flag_reference_is_generated_from_the_parser() -> None:
    assert _docs_gen.target_path().read_text(encoding="utf-8") == _docs_gen.render(), (
        "docs/reference/flags.md is stale: run python -m llamapy.serve._docs_gen")


def test_every_flag_spelling_is_on_the_page() -> None:
    page = _docs_gen.render()
    flags = [s for a in build_parser()._actions for s in a.option_strings
             if s not in ("-h", "--help")]
    missing = [s for s in flags if f"`{s}`" not in page and f"`{s} " not in page]
    assert not missing


def test_a_tree_option_names_its_keyword_default_and_variable() -> None:
    row = next(line for line in _docs_gen.render().splitlines()
               if line.startswith("| `--n-ctx INT`"))
    assert "`-c INT`" in row and "`LLAMA_ARG_CTX_SIZE`" in row
    assert "| `8192` |" in row and "`Server` keyword `n_ctx`" in row


def test_check_flag_exits_1_on_a_stale_page(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "flags.md"
    monkeypatch.setattr(_docs_gen, "target_path", lambda: page)
    monkeypatch.setattr(sys, "argv", ["_docs_gen", "--check"])
    page.write_text("stale", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_:
        _docs_gen.main()
    assert exit_.value.code == 1
    monkeypatch.setattr(sys, "argv", ["_docs_gen"])
    _docs_gen.main()
    assert page.read_text(encoding="utf-8") == _docs_gen.render()


def test_the_generator_runs_as_a_module() -> None:
    done = subprocess.run([sys.executable, "-m", "llamapy.serve._docs_gen", "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
