"""Property: sessions interleaved with each other and with plain requests on one engine give
each session the same output as it gets solo (and plain requests their reference output)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st
from session_fakes import make_engine, open_fake

from llamapy.engine.options import RequestOptions
from llamapy.engine.request import Request
from llamapy.engine.testing import Recorder
from llamapy.session import DecodeConfig, PrefixInput, Session, SuffixInput

tokens = st.lists(st.integers(2, 63), min_size=1, max_size=40)
turn = st.tuples(tokens, tokens, st.integers(1, 6))  # prefix, suffix, max_tokens
script = st.lists(turn, min_size=1, max_size=3)


def run_turns(session: Session, turns: list[tuple[list[int], list[int], int]],
              between: object = None) -> list[list[int]]:
    """Run each turn; ``between`` (called after every stream step) interleaves other work."""
    out = []
    for prefix, suffix, n in turns:
        session.ensure_prefix(PrefixInput(token_ids=tuple(prefix)))
        session.prefill_suffix(SuffixInput(token_ids=tuple(suffix)))
        start = len(session.resident)
        for chunk in session.decode(DecodeConfig(max_tokens=n, temperature=0.8, seed=5)):
            assert chunk.error is None
            if callable(between):
                between()
        out.append(session.resident[start:])
    return out


@given(a=script, b=script, plain=st.lists(tokens, max_size=3))
def test_interleaved_sessions_match_solo(a: list, b: list, plain: list) -> None:
    solo_a = run_turns(open_fake(make_engine(n_parallel=1)), a)
    solo_b = run_turns(open_fake(make_engine(n_parallel=1)), b)

    engine = make_engine(n_parallel=3)
    sa, sb = open_fake(engine), open_fake(engine)
    recorders = []
    for i, prompt in enumerate(plain):
        rec = Recorder()
        opts = RequestOptions(max_tokens=4, sampling=replace(engine.config.sampling, seed=i))
        engine.submit(Request(request_id=("plain", i), token_ids=prompt, options=opts, sink=rec))
        recorders.append((prompt, opts, rec))
    b_iter = iter(b)
    got_b: list[list[int]] = []

    def step_b() -> None:  # one whole turn of b between a's stream steps
        nxt = next(b_iter, None)
        if nxt is not None:
            got_b.extend(run_turns(sb, [nxt]))

    got_a = run_turns(sa, a, between=step_b)
    got_b.extend(run_turns(sb, list(b_iter)))
    while engine.tick():
        engine.check_integrity()
    assert got_a == solo_a
    assert got_b == solo_b
    for prompt, opts, rec in recorders:
        assert rec.tokens == engine.backend.model.reference(prompt, 4, opts.sampling)
    sa.close()
    sb.close()
    engine.check_integrity()
