"""The README is the front page: its set-up and test commands come first, unchanged (CI runs
the test command), and every relative link in it names a file of the repository (the docs
site checks its own links with ``mkdocs build --strict``; GitHub shows the README's)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")

SET_UP = ('python3 -m pip install -e ".[serve,test,dev]" && python3 build_lib.py && '
          "python3 -m llamapy.models fetch --all && python3 -m llamapy.serve")


def test_the_two_commands_are_the_first_code_blocks() -> None:
    blocks = re.findall(r"```(\w*)\n(.*?)```", README, re.S)
    assert blocks[0] == ("bash", SET_UP + "\n")
    assert blocks[1] == ("bash", "python3 -m pytest -q\n")


def test_relative_links_name_files_of_the_repository() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links to the docs pages"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing
