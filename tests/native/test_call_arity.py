"""Every ``lib.<function>(...)`` and ``shim.<function>(...)`` call in the package passes as many
arguments as the pinned headers (and the shim's) declare (cffi checks only when the call runs:
a penalties sampler built with the previous signature failed only once a request set a
penalty). libmtmd's calls (``mtmd_*``) are checked against libmtmd."""

from __future__ import annotations

import ast
from pathlib import Path

import llamapy
from llamapy._native._loader import media_lib, native


def lib_calls() -> list[tuple[str, int, str, str, int]]:
    root = Path(llamapy.__file__).parent
    calls = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if name in ("lib", "shim") and not any(isinstance(a, ast.Starred)
                                                   for a in node.args):
                calls.append((str(path.relative_to(root)), node.lineno, name, node.func.attr,
                              len(node.args)))
    return calls


def test_every_native_call_matches_its_declaration() -> None:
    nat = native()
    calls = lib_calls()
    assert len(calls) > 50  # the scan sees the binding
    assert sum(owner == "shim" for _, _, owner, _, _ in calls) >= 10  # and the shim's calls
    wrong = []
    for path, line, owner, function, n_args in calls:
        library = media_lib() if function.startswith("mtmd_") else getattr(nat, owner)
        declared = nat.ffi.typeof(getattr(library, function))
        if n_args != len(declared.args) and not declared.ellipsis:
            wrong.append(f"{path}:{line} {function}: {n_args} args, declared "
                         f"{len(declared.args)}")
    assert not wrong, wrong
