"""The pages' files (no model, no browser): every one ships in the wheel, every asset the pages
load is local (they work offline), and the vendored libraries are the pinned bytes."""

from __future__ import annotations

import fnmatch
import hashlib
import re
from pathlib import Path

import llamapy
from llamapy.serve.app import STATIC_DIR

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(llamapy.__file__).parent


def package_data() -> list[str]:
    """The ``llamapy`` package-data globs of pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.setuptools.package-data]", 1)[1]
    line = next(ln for ln in section.splitlines() if ln.startswith("llamapy"))
    return re.findall(r'"([^"]+)"', line)


def test_every_static_file_ships_in_the_wheel() -> None:
    globs = package_data()
    files = [p.relative_to(PACKAGE).as_posix() for p in STATIC_DIR.rglob("*") if p.is_file()]
    assert files
    missing = [f for f in files if not any(fnmatch.fnmatch(f, g) and f.count("/") == g.count("/")
                                           for g in globs)]
    assert not missing, f"not in package-data (the wheel would lack them): {missing}"


def test_the_pages_load_only_local_assets() -> None:
    for page in ("index.html", "dashboard.html"):
        html = (STATIC_DIR / page).read_text()
        refs = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert refs
        for ref in refs:
            assert not re.match(r"(https?:)?//", ref), f"{page} fetches {ref} from the network"
            assert not ref.startswith("/"), f"{page}: {ref} is absolute (breaks --api-prefix)"
            if ref.startswith("static/"):
                assert (STATIC_DIR / ref.removeprefix("static/")).is_file(), ref
    for script in STATIC_DIR.glob("*.js"):
        text = script.read_text()
        for ref in re.findall(r'from "\./([^"]+)"', text):
            assert (STATIC_DIR / ref).is_file(), f"{script.name} imports a missing {ref}"
        assert not re.search(r'fetch\("/', text), f"{script.name} fetches an absolute path"


def test_vendored_files_match_their_pinned_sha256() -> None:
    vendor = STATIC_DIR / "vendor"
    readme = (vendor / "README").read_text()
    pinned = dict(re.findall(r"^\| (\S+) \|.*\| ([0-9a-f]{64}) \|$", readme, re.MULTILINE))
    shipped = {p.name for p in vendor.iterdir() if p.suffix in (".js", ".css")}
    assert shipped == set(pinned)
    for name, digest in pinned.items():
        assert hashlib.sha256((vendor / name).read_bytes()).hexdigest() == digest, name
    for license_file in ("LICENSE.marked", "LICENSE.dompurify", "LICENSE.highlightjs"):
        assert (vendor / license_file).stat().st_size > 500
