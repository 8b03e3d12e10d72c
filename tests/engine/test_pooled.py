"""Pooled requests (a reranker's scoring) through the engine, on the fake backend.

A pooled request's prompt is decoded whole in one batch, every row an output; its
``DoneEvent`` carries the backend's pooled output, and nothing of it is reused or kept. The
fake backend's pooled output is a hash of the exact sequence it decoded, so a chunked prompt,
a reused prefix or another request's tokens would change it.
"""

from __future__ import annotations

import pytest

from llamapy.engine import EngineConfig, Request, RequestOptions
from llamapy.engine.engine import Engine
from llamapy.engine.fake.backend import FakeBackend
from llamapy.engine.fake.model import fake_pooled, pooled_history
from llamapy.engine.request import DoneEvent
from llamapy.engine.testing import Recorder, drain
from llamapy.errors import ContextOverflowError, InvalidOptionError, UnsupportedFeatureError

POOLED = RequestOptions(max_tokens=0)


def _engine(n_batch: int = 64, n_parallel: int = 4, strategy: str = "shortest_first",
            memoryless: bool = False) -> Engine:
    backend = FakeBackend(n_ctx=1024, n_seq_max=n_parallel, n_batch=n_batch, pools=True,
                          memoryless=memoryless, record_plans=True)
    return Engine(backend, EngineConfig(n_parallel=n_parallel, n_batch=n_batch,
                                        batch_strategy=strategy, chunk_size=8))


def _submit(engine: Engine, rid: str, prompt: list[int]) -> Recorder:
    sink = Recorder()
    engine.submit(Request(rid, prompt, POOLED, sink, pooled=True))
    return sink


def _expected(prompt: list[int]) -> tuple[float, ...]:
    return fake_pooled(pooled_history(prompt))


def _check(engine: Engine) -> None:
    engine.check_integrity()
    backend = engine.backend
    assert isinstance(backend, FakeBackend)
    backend.check_integrity()


@pytest.mark.parametrize("strategy", ["shortest_first", "decode_maximal", "prefill_priority",
                                      "balanced"])
@pytest.mark.parametrize("memoryless", [False, True])
def test_pooled_requests_share_decodes_and_get_their_own_output(strategy: str,
                                                                memoryless: bool) -> None:
    engine = _engine(strategy=strategy, memoryless=memoryless)
    prompts = [[1 + i] * (5 + 7 * i) for i in range(3)] + [[3, 1, 4, 1, 5]]
    sinks = [_submit(engine, f"r{i}", p) for i, p in enumerate(prompts)]
    drain(engine, each=lambda: _check(engine))
    backend = engine.backend
    assert isinstance(backend, FakeBackend)
    assert backend.num_decode_calls == 1  # 5 + 12 + 19 + 5 tokens: one batch of 64
    for sink, prompt in zip(sinks, prompts, strict=True):
        final = sink.final
        assert isinstance(final, DoneEvent) and str(final.finish_reason) == "prefill"
        assert final.pooled == _expected(prompt)
        assert final.prompt_tokens == len(prompt) and final.completion_tokens == 0
        assert final.timings.reused_tokens == 0 and final.timings.ttft_s is not None
    assert all(backend.seq_pos_max(s) == -1 for s in range(4))  # nothing kept


def test_a_prompt_is_never_split_across_decodes() -> None:
    engine = _engine(n_batch=16, n_parallel=3)
    prompts = [[2] * 10, [3] * 10, [4] * 6, [5] * 16]
    sinks = [_submit(engine, f"r{i}", p) for i, p in enumerate(prompts)]
    drain(engine, each=lambda: _check(engine))
    backend = engine.backend
    assert isinstance(backend, FakeBackend)
    for plan in backend.plans:
        assert plan.n_tokens <= 16
        assert all(seg.start_pos == 0 and seg.n_outputs == len(seg.token_ids)
                   for seg in plan.segments)
    assert [s.final.pooled for s in sinks if isinstance(s.final, DoneEvent)] == \
        [_expected(p) for p in prompts]


def test_the_same_prompt_twice_is_computed_twice_and_equal() -> None:
    engine = _engine()
    a, b = _submit(engine, "a", [7] * 9), _submit(engine, "b", [7] * 9)
    drain(engine, each=lambda: _check(engine))
    assert isinstance(a.final, DoneEvent) and isinstance(b.final, DoneEvent)
    assert a.final.pooled == b.final.pooled == _expected([7] * 9)
    assert engine.backend.num_decoded_tokens == 18  # type: ignore[attr-defined]


def test_cancelling_a_pooled_request_leaves_the_others() -> None:
    engine = _engine(n_parallel=1)
    sinks = [_submit(engine, f"r{i}", [i + 1] * 4) for i in range(3)]
    assert engine.cancel("r1")
    drain(engine, each=lambda: _check(engine))
    assert [s.finish_reason for s in sinks] == ["prefill", "cancelled", "prefill"]


def test_what_a_pooling_engine_refuses() -> None:
    engine = _engine(n_batch=16)
    with pytest.raises(ContextOverflowError) as info:
        _submit(engine, "long", [1] * 17)
    assert info.value.stage == "pool" and info.value.n_ctx == 16
    with pytest.raises(UnsupportedFeatureError):  # it generates nothing
        engine.submit(Request("gen", [1, 2], RequestOptions(max_tokens=4)))
    with pytest.raises(InvalidOptionError):
        engine.submit(Request("empty", [], POOLED, pooled=True))
    with pytest.raises(InvalidOptionError):
        engine.submit(Request("samples", [1], RequestOptions(max_tokens=2), pooled=True))
    plain = Engine(FakeBackend(n_ctx=256, n_seq_max=2), EngineConfig(n_parallel=2))
    with pytest.raises(UnsupportedFeatureError):
        plain.submit(Request("p", [1, 2], POOLED, pooled=True))
    assert not engine.runs and not plain.runs


def test_a_decode_error_fails_the_batch_and_frees_the_slots() -> None:
    engine = _engine()
    backend = engine.backend
    assert isinstance(backend, FakeBackend)
    backend.inject("decode_error", at_call=1)
    first = [_submit(engine, f"r{i}", [i + 1] * 3) for i in range(2)]
    drain(engine, each=lambda: _check(engine))
    assert [s.finish_reason for s in first] == ["error", "error"]
    again = _submit(engine, "again", [1] * 3)
    drain(engine, each=lambda: _check(engine))
    assert isinstance(again.final, DoneEvent) and again.final.pooled == _expected([1] * 3)


def test_a_decode_of_pooled_prompts_is_one_physical_batch() -> None:
    backend = FakeBackend(n_ctx=1024, n_seq_max=4, n_batch=64, n_ubatch=16, pools=True,
                          record_plans=True)
    engine = Engine(backend, EngineConfig(n_parallel=4, n_batch=64))
    assert engine.n_batch == 16
    sinks = [_submit(engine, f"r{i}", [i + 1] * (5 + i)) for i in range(4)]
    with pytest.raises(ContextOverflowError):
        _submit(engine, "long", [1] * 17)
    drain(engine, each=lambda: _check(engine))
    assert all(plan.n_tokens <= 16 for plan in backend.plans) and len(backend.plans) >= 2
    assert all(isinstance(s.final, DoneEvent) and s.final.pooled is not None for s in sinks)


def test_a_pooling_backend_needs_one_kv_pool() -> None:
    backend = FakeBackend(n_ctx=1024, n_seq_max=2, n_batch=64, pools=True, kv_unified=False)
    with pytest.raises(InvalidOptionError, match="kv_unified"):
        Engine(backend, EngineConfig(n_parallel=2, kv_unified=False))
