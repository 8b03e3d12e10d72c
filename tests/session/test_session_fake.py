"""The Session primitives on the fake backend (no model)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from session_fakes import disk_engine, fake_manifest, make_engine, open_fake

from llamapy.engine.engine import Engine
from llamapy.engine.options import SamplingParams
from llamapy.errors import (
    ContextOverflowError,
    DecodeError,
    InvalidOptionError,
    LeaseTimeoutError,
    ManifestMismatchError,
    SessionClosedError,
    SessionFatalError,
    SnapshotFormatError,
    UnsupportedFeatureError,
)
from llamapy.session import (
    DecodeConfig,
    PrefixInput,
    PrefixSegment,
    Session,
    SessionConfig,
    SessionSnapshot,
    StreamChunk,
    StructuredOutput,
    SuffixInput,
)
from llamapy.session.decoding import DecodeRun

Factory = Callable[..., Session]
PREFIX = tuple(range(2, 60)) * 3  # 174 tokens


def decoded(session: Session, n: int = 8) -> list[int]:
    before = session.explain_context().generated_tokens
    chunks = list(session.decode(DecodeConfig(max_tokens=n, temperature=0.8, seed=3)))
    assert all(c.error is None for c in chunks)
    return session.resident[len(session.resident) - (session.explain_context().generated_tokens
                                                       - before):]


def reference(engine: Engine, prompt: list[int], n: int) -> list[int]:
    params = replace(engine.config.sampling, temp=0.8, seed=3)
    return engine.backend.model.reference(prompt, n, params)  # type: ignore[attr-defined]


def test_warm_hit_and_divergence(session_factory: Factory, engine: Engine) -> None:
    with session_factory() as s:
        cold = s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        assert (cold.reused_tokens, cold.prefilled_tokens) == (0, len(PREFIX))
        warm = s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        assert (warm.reused_tokens, warm.prefilled_tokens, warm.dropped_tokens) == \
            (len(PREFIX), 0, 0)
        changed = list(PREFIX)
        changed[100] = 61
        mid = s.ensure_prefix(PrefixInput(token_ids=changed))
        assert mid.reused_tokens == 100
        assert mid.prefilled_tokens == len(PREFIX) - 100
        assert mid.dropped_tokens == len(PREFIX) - 100
        assert engine.leases.tokens(s._lease) == changed
    engine.check_integrity()


def test_suffix_replaced_prefix_untouched(session_factory: Factory, engine: Engine) -> None:
    with session_factory() as s:
        s.ensure_prefix(PrefixInput(text="stable workspace context " * 4))
        n = s.explain_context().prefix_tokens
        first = s.prefill_suffix(SuffixInput(text="diff one"))
        assert (first.reused_tokens, first.prefilled_tokens) == (0, first.suffix_tokens)
        decoded(s, 4)
        second = s.prefill_suffix(SuffixInput(text="test output two"))
        assert second.timings.reused_tokens >= n
        assert second.prefilled_tokens == second.suffix_tokens - second.reused_tokens
        report = s.explain_context()
        assert (report.prefix_tokens, report.generated_tokens) == (n, 0)
        assert engine.leases.tokens(s._lease) == s.resident


def test_decode_matches_reference_and_continues(session_factory: Factory,
                                                engine: Engine) -> None:
    with session_factory() as s:
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        s.prefill_suffix(SuffixInput(token_ids=(5, 6, 7)))
        prompt = list(s.resident)
        got = decoded(s, 8)
        assert got == reference(engine, prompt, 8)
        if got[-1] != 0:  # continue after the generated tokens
            more = decoded(s, 4)
            assert more == reference(engine, prompt + got, 4)


def test_segments_manifest_ranges(session_factory: Factory) -> None:
    with session_factory() as s:
        segs = (PrefixSegment(kind="instructions", text="be brief"),
                PrefixSegment(kind="repo_map", text="a.py b.py"))
        status = s.ensure_prefix(PrefixInput(segments=segs))
        m = s.manifest
        assert [x.kind for x in m.segments] == ["instructions", "repo_map"]
        assert m.segments[0].token_end == m.segments[1].token_start == 9  # BOS + 8 bytes
        assert m.segments[1].token_end == status.prefix_tokens
        assert m.segments[1].byte_start == 8


def test_manifest_change_forces_cold_prefill(session_factory: Factory) -> None:
    with session_factory() as s:
        first = s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        assert first.cold and not first.warm and not first.identity_changed
        again = s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        assert again.warm and not again.cold and not again.identity_changed
        other = s.base_manifest.replace(chat_template_digest="other-template")
        status = s.ensure_prefix(PrefixInput(token_ids=PREFIX, manifest=other))
        assert status.cold and status.identity_changed and status.reused_tokens == 0
        assert status.prefilled_tokens == len(PREFIX)
        bos = s.ensure_prefix(PrefixInput(token_ids=PREFIX, add_bos=False))
        assert bos.cold and bos.identity_changed and bos.reused_tokens == 0
        lie = s.base_manifest.replace(model_digest="another-model")
        with pytest.raises(ManifestMismatchError) as info:
            s.ensure_prefix(PrefixInput(token_ids=PREFIX, manifest=lie))
        assert info.value.field == "model_digest"


def test_overflow_at_each_stage_changes_nothing(engine: Engine) -> None:
    with open_fake(engine) as s:
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        s.prefill_suffix(SuffixInput(token_ids=(5,) * 100))
        before, kv = s.explain_context(), engine.leases.tokens(s._lease)
        with pytest.raises(ContextOverflowError) as e1:
            s.ensure_prefix(PrefixInput(token_ids=PREFIX * 3))
        assert (e1.value.stage, e1.value.resident_tokens, e1.value.additional_tokens,
                e1.value.n_ctx) == ("ensure_prefix", len(PREFIX), 2 * len(PREFIX), 512)
        with pytest.raises(ContextOverflowError) as e2:
            s.prefill_suffix(SuffixInput(token_ids=(5,) * 400))
        assert (e2.value.stage, e2.value.resident_tokens, e2.value.additional_tokens) == \
            ("prefill_suffix", len(PREFIX), 400)
        with pytest.raises(ContextOverflowError) as e3:
            s.decode(DecodeConfig(max_tokens=300))
        assert (e3.value.stage, e3.value.resident_tokens, e3.value.additional_tokens) == \
            ("decode", len(PREFIX) + 100, 300)
        assert s.explain_context() == before
        assert engine.leases.tokens(s._lease) == kv


def test_snapshot_restore_roundtrip(tmp_path: Path, engine: Engine) -> None:
    with open_fake(engine) as s:
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        s.prefill_suffix(SuffixInput(token_ids=(9, 9, 9)))
        decoded(s, 3)
        snap = s.snapshot()
        snap.save(tmp_path / "s.snap")
        expected = decoded(s, 5)
        s.ensure_prefix(PrefixInput(token_ids=(4, 4, 4)))
        s.restore(SessionSnapshot.load(tmp_path / "s.snap"))
        assert s.resident == list(snap.token_ids)
        assert decoded(s, 5) == expected


def test_snapshots_live_in_the_disk_prompt_cache(tmp_path: Path, engine: Engine) -> None:
    with open_fake(engine) as s:  # no disk cache: nothing saved, nothing found
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        assert not s.save_snapshot("review") and not s.load_snapshot("review")
    first = disk_engine(tmp_path)
    with open_fake(first) as s:
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        s.prefill_suffix(SuffixInput(token_ids=(9, 9, 9)))
        decoded(s, 3)
        assert s.save_snapshot("review")
        resident, expected = s.resident, decoded(s, 5)
    first.close()
    again = disk_engine(tmp_path)  # a restart: another engine on the folder finds it
    assert again.stats().disk_cache_entries >= 1
    with open_fake(again) as s:
        s.ensure_prefix(PrefixInput(token_ids=(4, 4, 4)))
        assert not s.load_snapshot("another name")
        assert s.load_snapshot("review")
        assert s.resident == resident and decoded(s, 5) == expected


def test_mismatched_restore_refused(engine: Engine) -> None:
    with open_fake(engine) as s:
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        snap = s.snapshot()
        s.ensure_prefix(PrefixInput(token_ids=(4, 4)))
        before = s.explain_context()
        bad = replace(snap, manifest=snap.manifest.replace(runtime_digest="x"))
        with pytest.raises(ManifestMismatchError) as info:
            s.restore(bad)
        assert info.value.field == "runtime_digest"
        with pytest.raises(ManifestMismatchError):
            s.restore(replace(snap, n_ctx=1024))
        assert s.explain_context() == before


def test_snapshot_file_format_checked(tmp_path: Path, engine: Engine) -> None:
    with open_fake(engine) as s:
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        data = bytearray(s.snapshot().to_bytes())
    assert SessionSnapshot.from_bytes(bytes(data)).token_ids == PREFIX
    flipped = bytearray(data)
    flipped[40] ^= 1
    for bad in (bytes(flipped), b"XXXXXXXX" + bytes(data[8:]), bytes(data[:50])):
        with pytest.raises(SnapshotFormatError):
            SessionSnapshot.from_bytes(bad)


def test_an_engine_error_mid_prefill_rolls_back_and_the_session_serves_on(
        engine: Engine) -> None:
    with open_fake(engine) as s:
        s.ensure_prefix(PrefixInput(token_ids=PREFIX[:10]))
        engine.backend.inject("decode_error", at_call=engine.backend.num_decode_calls + 2)  # type: ignore[attr-defined]
        with pytest.raises(DecodeError):
            s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        kept = s.resident
        assert 10 < len(kept) < len(PREFIX) and kept == list(PREFIX[:len(kept)])
        assert s.explain_context().prefix_tokens == len(kept) and not s.explain_context().fatal
        retry = s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        assert retry.reused_tokens == len(kept) and s.resident == list(PREFIX)


def test_a_kv_that_cannot_be_reconciled_is_fatal(engine: Engine,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    s = open_fake(engine)
    s.ensure_prefix(PrefixInput(token_ids=PREFIX[:10]))
    engine.backend.inject("decode_error")  # type: ignore[attr-defined]
    monkeypatch.setattr(engine.leases, "tokens", lambda lease: [63, 63, 63])
    with pytest.raises(SessionFatalError):
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
    monkeypatch.undo()
    with pytest.raises(SessionFatalError):
        s.prefill_suffix(SuffixInput(token_ids=(3,)))
    with pytest.raises(SessionFatalError):
        s.decode()
    assert s.explain_context().fatal
    s.close()
    assert engine.pool.leases == {}


def test_closed_session_and_lease_timeout() -> None:
    engine = make_engine(n_parallel=1)
    s = open_fake(engine)
    with pytest.raises(LeaseTimeoutError):
        open_fake(engine, config=SessionConfig(lease_timeout=0.05))
    s.close()
    s.close()
    with pytest.raises(SessionClosedError):
        s.ensure_prefix(PrefixInput(token_ids=(2,)))
    assert s.explain_context().closed
    open_fake(engine).close()


def test_unknown_parser_protocol_raises_before_submitting(session_factory: Factory) -> None:
    with session_factory() as s:
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        with pytest.raises(UnsupportedFeatureError):
            s.decode(DecodeConfig(parser_protocols=("nope",)))
        assert s.explain_context().num_decode_tokens == 0


def test_early_close_accounts_generated_tokens(session_factory: Factory,
                                               engine: Engine) -> None:
    with session_factory() as s:
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        stream = s.decode(DecodeConfig(max_tokens=50, temperature=0.8, seed=3))
        next(stream, None)
        stream.close()
        kv = engine.leases.tokens(s._lease)
        assert s.resident[:len(kv)] == kv and len(s.resident) - len(kv) <= 1
        s.prefill_suffix(SuffixInput(token_ids=(3, 3)))  # usable again


def test_manifest_roundtrip() -> None:
    m = fake_manifest(adapters=(("abc", 0.5),))
    assert m.from_dict(m.to_dict()) == m
    assert m.identity_digest != fake_manifest().identity_digest


def test_structured_output_validation() -> None:
    assert StructuredOutput(kind="grammar", grammar='root ::= "a"').schema is None
    for bad in ({"kind": "grammar"}, {"kind": "grammar", "grammar": "", "schema": {}},
                {"kind": "json_schema", "schema": {}, "grammar": 'root ::= "a"'},
                {"kind": "json_schema"}):
        with pytest.raises(InvalidOptionError):
            StructuredOutput(**bad)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedFeatureError):
        StructuredOutput(kind="regex")
    run = DecodeRun(DecodeConfig(structured_output=StructuredOutput(
        kind="grammar", grammar='root ::= "a"')), SamplingParams())
    assert run.sampling.grammar == 'root ::= "a"'


@pytest.mark.parametrize(("tail", "fmt", "expected"), [
    ("Assistant: <think>\n", "auto", ("why", "answer")),
    ("Assistant:", "auto", ("", "why</think>answer")),
    ("Assistant: <think>", "none", ("", "why</think>answer")),
])
def test_prompt_that_opens_reasoning(tail: str, fmt: str, expected: tuple[str, str]) -> None:
    run = DecodeRun(DecodeConfig(parser_protocols=("think",), reasoning_format=fmt),
                    SamplingParams(), prompt_tail=tail)
    chunks = [run.feed("why</thi"), run.feed("nk>answer"), run.finish("eog")]
    got = [c for c in chunks if c is not None]
    assert ("".join(c.thinking for c in got), "".join(c.text for c in got)) == expected


def test_adecode_matches_decode_and_cancel_frees(session_factory: Factory) -> None:
    async def collect(s: Session, limit: int | None = None) -> list[StreamChunk]:
        out: list[StreamChunk] = []
        stream = s.adecode(DecodeConfig(max_tokens=12, temperature=0.8, seed=3))
        async for chunk in stream:
            out.append(chunk)
            if len(out) == limit:
                await stream.aclose()  # type: ignore[attr-defined]
                break
        return out

    with session_factory() as s:
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        expected = decoded(s, 12)
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        chunks = asyncio.run(collect(s))
        assert s.resident[len(PREFIX):] == expected
        assert chunks[-1].finish_reason in ("max_tokens", "eog")
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        assert len(asyncio.run(collect(s, limit=1))) == 1
        assert 1 <= s.explain_context().generated_tokens < 12
        assert decoded(s, 2)  # not busy, not fatal


def test_embed_needs_a_model(session_factory: Factory) -> None:
    with session_factory() as s, pytest.raises(UnsupportedFeatureError) as info:
        s.embed("no model behind the fake engine")
    assert info.value.feature == "embeddings"
