"""Speculation only while few requests decode (``spec_max_streams``), on the fake backend:
a tick with more decoding requests than the bound drafts nothing, and outputs are the
reference's either way."""

from __future__ import annotations

import pytest
from spec_helpers import (
    ENDLESS,
    SMALL,
    SMALL_PROMPTS,
    OracleDrafter,
    job,
    reference_of,
    run_jobs,
    spec_engine,
)

from llamapy.engine import FakeBackend
from llamapy.errors import InvalidOptionError
from llamapy.options.speculative import speculative_overrides


def drafting_streams(backend: FakeBackend) -> list[tuple[int, int]]:
    """``(decoding segments, drafted segments)`` of every tick that decoded."""
    out = []
    for plan in backend.plans:
        decoding = [seg for seg in plan.segments if seg.logits]
        if decoding:
            out.append((len(decoding), sum(seg.n_outputs > 1 for seg in decoding)))
    return out


@pytest.mark.parametrize("max_streams", [1, 2, 0])
def test_drafts_only_while_at_most_max_streams_decode(max_streams: int) -> None:
    """A tick with more decoding requests than ``spec_max_streams`` drafts nothing (0: any
    number); the outputs are the reference's either way."""
    drafter = OracleDrafter(ENDLESS)
    engine, backend = spec_engine(drafter=drafter, model=ENDLESS, n_parallel=3,
                                  spec_type="draft", spec_adaptive=False,
                                  spec_draft_n_max=2, spec_max_streams=max_streams)
    jobs = [job(i, [10 + i, 20 + i, 30 + i], max_tokens=12 + 10 * i, seed=i) for i in range(3)]
    run_jobs(engine, backend, jobs)  # they end one by one: 3, then 2, then 1 decoding
    for j in jobs:
        assert j.sink.tokens == reference_of(backend, j)
    ticks = drafting_streams(backend)
    limit = max_streams or 3
    assert all(drafted == 0 for n, drafted in ticks if n > limit), ticks
    assert any(drafted > 0 for n, drafted in ticks if n == limit), ticks
    assert any(drafted > 0 for n, drafted in ticks if n == 1), ticks


def test_a_request_may_set_max_streams_and_it_is_validated() -> None:
    engine, backend = spec_engine(model=SMALL, n_parallel=2, spec_type="ngram",
                                  spec_adaptive=False, spec_max_streams=1)
    jobs = [job(i, SMALL_PROMPTS[i], max_tokens=40, speculative={"max_streams": 0})
            for i in range(2)]
    run_jobs(engine, backend, jobs)
    ticks = drafting_streams(backend)
    assert any(n == 2 and drafted > 0 for n, drafted in ticks), ticks
    for bad in (-1, 1.5, "2"):
        with pytest.raises(InvalidOptionError):
            speculative_overrides({"max_streams": bad})
