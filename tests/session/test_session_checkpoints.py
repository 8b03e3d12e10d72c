"""Sessions on a model whose state cannot be cut back (the fake backend's recurrent mode): the
stable prefix's segment ends and its end are restore points, so a changed later segment or a
new suffix resumes there instead of recomputing the prefix. The fake's recurrent state turns a
wrong restore into an integrity violation and a different output."""

from __future__ import annotations

from dataclasses import replace

from session_fakes import open_fake

from llamapy.engine.engine import Engine
from llamapy.engine.fake.backend import FakeBackend
from llamapy.engine.options import EngineConfig, SamplingParams
from llamapy.session import DecodeConfig, PrefixInput, PrefixSegment, Session, SuffixInput

RULES = "Answer briefly and cite the file you read. " * 5
REPO = "src/a.py src/b.py src/c.py tests/test_a.py " * 5


def hybrid_engine() -> Engine:
    """One slot of a fake recurrent model, checkpoints only where the session asks (and at
    each prompt's end)."""
    backend = FakeBackend(n_ctx=2048, n_seq_max=1, n_batch=64, kv_unified=False,
                          supports_partial_removal=False)
    config = EngineConfig(n_parallel=1, n_batch=64, chunk_size=32, kv_unified=False,
                          checkpoint_min_step=0, sampling=SamplingParams(seed=7, temp=0.8))
    return Engine(backend, config)


def prefix(repo: str) -> PrefixInput:
    return PrefixInput(segments=(PrefixSegment(kind="instructions", text=RULES),
                                 PrefixSegment(kind="repo_map", text=repo)))


def decoded(session: Session, engine: Engine) -> list[int]:
    chunks = list(session.decode(DecodeConfig(max_tokens=6, temperature=0.8, seed=3)))
    assert all(c.error is None for c in chunks)
    engine.backend.check_integrity()  # type: ignore[attr-defined]
    resident = session.resident
    return resident[len(resident) - session.explain_context().generated_tokens:]


def reference(engine: Engine, prompt: list[int]) -> list[int]:
    params = replace(engine.config.sampling, temp=0.8, seed=3)
    return engine.backend.model.reference(prompt, 6, params)  # type: ignore[attr-defined]


def test_a_changed_later_segment_resumes_at_the_end_of_the_one_before() -> None:
    engine = hybrid_engine()
    with open_fake(engine) as session:
        session.ensure_prefix(prefix(REPO))
        rules_end = session.manifest.segments[0].token_end
        status = session.ensure_prefix(prefix("src/d.py " + REPO))
        assert status.identity_changed is False
        assert status.reused_tokens == rules_end
        assert status.timings.checkpoint_tokens == rules_end
        session.prefill_suffix(SuffixInput(text="\nUser: where is d?\nAssistant:"))
        answer = decoded(session, engine)
        assert answer == reference(engine, session.resident[:len(session.resident) - len(answer)])


def test_each_new_suffix_resumes_at_the_end_of_the_stable_prefix() -> None:
    engine = hybrid_engine()
    with open_fake(engine) as session:
        n_fixed = session.ensure_prefix(prefix(REPO)).prefix_tokens
        for question in ("what is a?", "what is b?", "what is c?"):
            session.ensure_prefix(prefix(REPO))
            status = session.prefill_suffix(SuffixInput(text=f"\nUser: {question}\nAssistant:"))
            assert status.timings.reused_tokens >= n_fixed
            answer = decoded(session, engine)
            asked = session.resident[:len(session.resident) - len(answer)]
            assert answer == reference(engine, asked)
