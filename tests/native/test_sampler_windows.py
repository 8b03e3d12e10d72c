"""Look-back windows reach libllama fitted to the context (``fit_windows`` in
``LlamaBackend.new_sampler``): ``penalty_last_n = 2**31 - 1`` made llama.cpp allocate a ring of
that many tokens up front (8 GiB; 16 s of tick thread), and DRY's window likewise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Runs in a child whose address space is capped just above what it uses once the model and a
#: context are loaded: a window of 2**31 - 1 tokens cannot be allocated there, one of the
#: context's length can.
_CHILD = r"""
import json, resource
from llamapy._native import Context, Model
from llamapy.llama_backend import LlamaBackend
from llamapy.models import default_model_path
from llamapy.options.sampling import SamplingParams

model = Model(default_model_path())
ctx = Context(model, n_ctx=256, n_batch=64, n_threads=1)
backend = LlamaBackend(model, ctx)
huge = 2**31 - 1
cases = {
    "penalties": SamplingParams(penalty_last_n=huge, penalty_repeat=1.1, temp=0.0),
    "dry": SamplingParams(dry_multiplier=0.8, dry_penalty_last_n=huge, temp=0.0),
    "context": SamplingParams(penalty_last_n=-1, penalty_repeat=1.1, dry_multiplier=0.8,
                              temp=0.0),
}
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + (64 << 20), resource.RLIM_INFINITY))
results = {}
for name, params in cases.items():
    try:
        backend.new_sampler(params).close()
        results[name] = "ok"
    except Exception as exc:
        results[name] = type(exc).__name__
print(json.dumps(results))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")
def test_windows_past_the_context_are_built_at_the_contexts_length() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert results == {"penalties": "ok", "dry": "ok", "context": "ok"}
