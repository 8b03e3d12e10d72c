"""Run code in a child interpreter whose address space is capped (plain module: tests import
it by name): what a request could ask libllama to allocate then fails there, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Linux only: the cap is RLIMIT_AS, measured from /proc.
LINUX_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="RLIMIT_AS and /proc: Linux")

#: The child's code ends with this, after defining ``cases`` (name -> a callable) and ``cap``
#: (bytes allowed above what it uses by then): it caps itself, runs each case and prints each
#: name with "ok" or the name of the exception it raised.
RUN_CASES = r"""
import json, resource
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + cap, resource.RLIM_INFINITY))
results = {}
for name, case in cases.items():
    try:
        case()
        results[name] = "ok"
    except Exception as exc:
        results[name] = type(exc).__name__
print(json.dumps(results))
"""


def run_capped(code: str) -> dict[str, str]:
    """Run ``code`` + :data:`RUN_CASES` in a fresh interpreter; each case's outcome."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code + RUN_CASES], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    results: dict[str, str] = json.loads(out.stdout.strip().splitlines()[-1])
    return results
