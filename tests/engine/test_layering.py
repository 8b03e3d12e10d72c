"""``llamapy/engine`` stays backend-agnostic: it never imports cffi or ``llamapy._native``."""

from __future__ import annotations

import ast
from pathlib import Path

import llamapy.engine

ENGINE = Path(llamapy.engine.__file__).parent
FORBIDDEN = ("cffi", "_cffi_backend", "llamapy._native", "llamapy.llama_backend")


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against llamapy.engine
                base = ["llamapy", "engine"][: max(0, 2 - (node.level - 1))]
                found.append(".".join([*base, *filter(None, [node.module])]))
            else:
                found.append(node.module or "")
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            found += [a.value for a in node.args if isinstance(a, ast.Constant)]
    return found


def test_engine_never_imports_cffi_or_native():
    files = sorted(ENGINE.rglob("*.py"))
    assert len(files) > 5
    bad = [(f.name, m) for f in files for m in imported_modules(f)
           if any(m == x or m.startswith(x + ".") for x in FORBIDDEN)]
    assert bad == []


def test_the_scan_catches_forbidden_imports(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("import cffi\nfrom .._native import lib\nfrom llamapy._native.x import y\n")
    mods = imported_modules(sample)
    assert "cffi" in mods and "llamapy._native" in mods and "llamapy._native.x" in mods
