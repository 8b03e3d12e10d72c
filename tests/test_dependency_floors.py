"""Dependency floors that are security fixes: chat templates come with the models a server is
given (and with ``--pull-on-demand``, with models a request names), and they run in jinja2's
sandbox, which jinja2 3.1.0 to 3.1.5 let a template escape (fixed in 3.1.6). The floor in
pyproject.toml must admit none of them, and the jinja2 the tests run on must be a fixed one."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
#: The jinja2 releases with known sandbox escapes, and the first without.
ESCAPABLE = tuple(Version(f"3.1.{n}") for n in range(6))
FIXED = Version("3.1.6")


def _requirements(name: str) -> list[Requirement]:
    """Every quoted requirement of ``name`` in pyproject.toml (dependencies and extras)."""
    quoted = re.findall(r'"([A-Za-z0-9_.\[\]-]+\s*[<>=!~][^"]*)"', PYPROJECT.read_text())
    return [r for r in map(Requirement, quoted) if r.name.lower() == name]


def test_the_jinja2_floor_admits_no_sandbox_escape() -> None:
    found = _requirements("jinja2")
    assert found, "pyproject.toml requires no jinja2"
    for requirement in found:
        assert not any(requirement.specifier.contains(v) for v in ESCAPABLE), requirement
        assert requirement.specifier.contains(FIXED), requirement


def test_the_installed_jinja2_is_a_fixed_one() -> None:
    assert Version(importlib.metadata.version("jinja2")) >= FIXED
