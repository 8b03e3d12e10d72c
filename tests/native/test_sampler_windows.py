"""Look-back windows reach libllama fitted to the context (``fit_windows`` in
``LlamaBackend.new_sampler``): ``penalty_last_n = 2**31 - 1`` made llama.cpp allocate a ring of
that many tokens up front (8 GiB; 16 s of tick thread), and DRY's window likewise."""

from __future__ import annotations

from capped_child import LINUX_ONLY, run_capped

#: Runs in a child whose address space is capped just above what it uses once the model and a
#: context are loaded: a window of 2**31 - 1 tokens cannot be allocated there, one of the
#: context's length can.
_CHILD = r"""
from llamapy._native import Context, Model
from llamapy.llama_backend import LlamaBackend
from llamapy.models import default_model_path
from llamapy.options.sampling import SamplingParams

model = Model(default_model_path())
ctx = Context(model, n_ctx=256, n_batch=64, n_threads=1)
backend = LlamaBackend(model, ctx)
huge = 2**31 - 1
params = {
    "penalties": SamplingParams(penalty_last_n=huge, penalty_repeat=1.1, temp=0.0),
    "dry": SamplingParams(dry_multiplier=0.8, dry_penalty_last_n=huge, temp=0.0),
    "context": SamplingParams(penalty_last_n=-1, penalty_repeat=1.1, dry_multiplier=0.8,
                              temp=0.0),
}
cases = {name: (lambda p=p: backend.new_sampler(p).close()) for name, p in params.items()}
cap = 64 << 20
"""


@LINUX_ONLY
def test_windows_past_the_context_are_built_at_the_contexts_length() -> None:
    assert run_capped(_CHILD) == {"penalties": "ok", "dry": "ok", "context": "ok"}
