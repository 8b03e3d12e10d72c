"""Workspace sessions on the real default model (short: few tokens, small contexts)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from llamapy.errors import (
    ContextOverflowError,
    InvalidOptionError,
    ManifestMismatchError,
    SessionClosedError,
    UnsupportedFeatureError,
)
from llamapy.server import Server
from llamapy.session import (
    DecodeConfig,
    PrefixInput,
    Session,
    SessionConfig,
    SessionSnapshot,
    StreamChunk,
    StructuredOutput,
    SuffixInput,
    open_standalone,
)

STABLE = "You are a careful coding assistant. Repository map: src/a.py src/b.py tests/t.py. " * 3
GREEDY = DecodeConfig(max_tokens=8, temperature=0.0)


WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"enum": ["Paris", "Berlin", "Rome"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}


def answer(session: Session, config: DecodeConfig = GREEDY) -> str:
    return "".join(c.text for c in chunks_of(session, config))


def chunks_of(session: Session, config: DecodeConfig) -> list[StreamChunk]:
    chunks = list(session.decode(config))
    assert all(c.error is None for c in chunks), chunks
    return chunks


def turn(session: Session, user: str, assistant: str = "") -> None:
    """The stable prefix (warm after the first call), a user turn, the answer's start."""
    session.ensure_prefix(PrefixInput(text=STABLE))
    session.prefill_suffix(SuffixInput(text=f"\nUser: {user}\nAssistant:{assistant}"))


def test_warm_hit_and_divergence(server: Server) -> None:
    with server.open_session() as s:
        cold = s.ensure_prefix(PrefixInput(text=STABLE))
        assert cold.prefilled_tokens == cold.prefix_tokens
        warm = s.ensure_prefix(PrefixInput(text=STABLE))
        assert (warm.reused_tokens, warm.prefilled_tokens) == (warm.prefix_tokens, 0)
        tokens = server.tokenize(STABLE)
        changed = tokens[:20] + server.tokenize(" banana", False) + tokens[21:]
        k = next(i for i, (a, b) in enumerate(zip(tokens, changed, strict=False)) if a != b)
        mid = s.ensure_prefix(PrefixInput(token_ids=tuple(changed)))
        assert mid.reused_tokens == k
        assert mid.prefilled_tokens == len(changed) - k


def test_manifest_change_forces_cold_prefill(server: Server) -> None:
    with server.open_session() as s:
        s.ensure_prefix(PrefixInput(text=STABLE))
        other = s.base_manifest.replace(chat_template_digest="my-own-template")
        status = s.ensure_prefix(PrefixInput(text=STABLE, manifest=other))
        assert status.cold and status.reused_tokens == 0
        assert status.prefilled_tokens == status.prefix_tokens


def test_suffix_replaced_prefix_untouched(server: Server) -> None:
    with server.open_session() as s:
        n = s.ensure_prefix(PrefixInput(text=STABLE)).prefix_tokens
        s.prefill_suffix(SuffixInput(text="\nUser: what is in src/a.py?\nAssistant:"))
        first = answer(s)
        second = s.prefill_suffix(SuffixInput(text="\nUser: list the tests.\nAssistant:"))
        assert second.timings.reused_tokens >= n
        assert second.prefilled_tokens == second.suffix_tokens - second.reused_tokens
        assert s.explain_context().prefix_tokens == n
        assert isinstance(first, str)


def test_overflow_at_each_stage(server: Server) -> None:
    with server.open_session() as s:
        n = s.ensure_prefix(PrefixInput(text=STABLE)).prefix_tokens
        before = s.explain_context()
        n_ctx = s.n_ctx
        with pytest.raises(ContextOverflowError) as e1:
            s.ensure_prefix(PrefixInput(token_ids=(42,) * (n_ctx + 1)))
        assert (e1.value.stage, e1.value.additional_tokens, e1.value.n_ctx) == \
            ("ensure_prefix", n_ctx + 1 - e1.value.resident_tokens, n_ctx)
        with pytest.raises(ContextOverflowError) as e2:
            s.prefill_suffix(SuffixInput(token_ids=(42,) * (n_ctx - n + 1)))
        assert (e2.value.resident_tokens, e2.value.additional_tokens) == (n, n_ctx - n + 1)
        with pytest.raises(ContextOverflowError) as e3:
            s.decode(DecodeConfig(max_tokens=n_ctx))
        assert (e3.value.stage, e3.value.resident_tokens) == ("decode", n)
        assert s.explain_context() == before


_CHILD = """
import sys, numpy as np
from llamapy._native import Model
from llamapy.session import SessionConfig, SessionSnapshot, open_standalone
snap = SessionSnapshot.load(sys.argv[2])
with Model(sys.argv[1]) as model:
    with open_standalone(model, SessionConfig(n_ctx=snap.n_ctx)) as s:
        s.restore(snap)
        np.save(sys.argv[3], s.next_token_logits())
"""


def test_snapshot_restored_in_new_process_same_logits(server: Server, model_path: Path,
                                                      tmp_path: Path) -> None:
    with server.open_session() as s:
        s.ensure_prefix(PrefixInput(text=STABLE))
        s.prefill_suffix(SuffixInput(text="\nUser: hi\nAssistant:"))
        answer(s, DecodeConfig(max_tokens=3, temperature=0.0))
        live = s.next_token_logits()
        s.snapshot().save(tmp_path / "s.snap")
    out = tmp_path / "logits.npy"
    subprocess.run([sys.executable, "-c", _CHILD, str(model_path), str(tmp_path / "s.snap"),
                    str(out)], check=True, timeout=120)
    restored = np.load(out)
    assert int(np.argmax(restored)) == int(np.argmax(live))
    assert np.allclose(restored, live, rtol=1e-3, atol=2e-2), np.abs(restored - live).max()


def test_mismatched_restore_refused(server: Server) -> None:
    with server.open_session() as s:
        s.ensure_prefix(PrefixInput(text=STABLE))
        snap = s.snapshot()
        before = s.explain_context()
        for field in ("model_digest", "runtime_digest", "tokenizer"):
            bad = replace(snap, manifest=snap.manifest.replace(**{field: "other"}))
            with pytest.raises(ManifestMismatchError) as info:
                s.restore(bad)
            assert info.value.field == field
        assert s.explain_context() == before
        s.restore(SessionSnapshot.from_bytes(snap.to_bytes()))


def test_session_and_plain_requests_concurrently(server: Server) -> None:
    def turn() -> str:
        with server.open_session() as s:
            s.ensure_prefix(PrefixInput(text=STABLE))
            s.prefill_suffix(SuffixInput(text="\nUser: name one file.\nAssistant:"))
            return answer(s)

    solo = turn()
    plain: list[str] = []
    worker = threading.Thread(target=lambda: plain.extend(
        server.generate("Once upon a time", max_tokens=16, temp=0.0) for _ in range(2)))
    worker.start()
    together = turn()
    worker.join(60)
    assert together == solo
    assert len(plain) == 2


# --- decode paths ---------------------------------------------------------------------------------


def test_adecode_same_text_as_decode(server: Server) -> None:
    config = DecodeConfig(max_tokens=12, temperature=0.0)

    async def collect(s: Session) -> list[StreamChunk]:
        return [chunk async for chunk in s.adecode(config)]

    with server.open_session() as s:
        turn(s, "hi")
        expected = answer(s, config)
        turn(s, "hi")
        chunks = asyncio.run(collect(s))
        assert "".join(c.text for c in chunks) == expected and expected.strip()
        assert chunks[-1].finish_reason == "max_tokens"
        assert s.explain_context().generated_tokens == 12


def test_adecode_closed_early_frees_the_session(server: Server) -> None:
    async def first_chunk(s: Session) -> StreamChunk:
        async with contextlib.aclosing(s.adecode(DecodeConfig(max_tokens=32))) as stream:
            async for chunk in stream:
                return chunk
        raise AssertionError("no chunk")

    with server.open_session() as s:
        turn(s, "tell me a story")
        assert asyncio.run(first_chunk(s)).error is None
        assert 1 <= s.explain_context().generated_tokens < 32
        assert answer(s, DecodeConfig(max_tokens=2, temperature=0.0)) is not None


def test_json_schema_output_validates(server: Server) -> None:
    structured = StructuredOutput(kind="json_schema", schema=WEATHER)
    with server.open_session() as s:
        turn(s, "the weather in Rome for three days, as JSON")
        chunks = chunks_of(s, DecodeConfig(max_tokens=48, temperature=0.0,
                                           structured_output=structured))
        jsonschema.validate(json.loads("".join(c.text for c in chunks)), WEATHER)
        assert chunks[-1].finish_reason == "eog"


def test_json_schema_tool_calls_parsed(server: Server) -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
              "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER}}
    structured = StructuredOutput(kind="json_schema_tool_calls", schema=schema)
    with server.open_session() as s:
        turn(s, "what is the weather in Berlin?")
        chunks = chunks_of(s, DecodeConfig(max_tokens=64, temperature=0.0,
                                           structured_output=structured))
    assert "".join(c.text for c in chunks) == ""
    calls = [call for c in chunks for call in c.tool_calls]
    assert [call.name for call in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    assert calls[0].id


def split_think(raw: str, started: bool) -> tuple[str, str]:
    """The reference split of raw output into (reasoning, answer)."""
    body = raw if started else raw.lstrip().removeprefix("<think>")
    thinking, closed, rest = body.partition("</think>")
    assert closed, raw
    return thinking.strip(), rest.lstrip()


@pytest.mark.parametrize(("opens", "grammar"), [
    ("", 'root ::= "<think>" [a-z ]{4,40} "</think>" [A-Za-z ,.]{4,40}'),
    (" <think>", 'root ::= [a-z ]{4,40} "</think>" [A-Za-z ,.]{4,40}'),
], ids=["output-opens", "suffix-opens"])
def test_think_protocol_splits_reasoning(server: Server, opens: str, grammar: str) -> None:
    """A GBNF grammar forces the shape ``[<think>]...</think>...`` (the model picks the words);
    the raw output, decoded with reasoning left in the text, is the reference for the split."""
    forced = StructuredOutput(kind="grammar", grammar=grammar)
    raw_config = DecodeConfig(max_tokens=64, temperature=0.0, parser_protocols=("think",),
                              reasoning_format="none", structured_output=forced)
    with server.open_session() as s:
        turn(s, "why is the sky blue?", opens)
        raw = answer(s, raw_config)
        turn(s, "why is the sky blue?", opens)
        chunks = chunks_of(s, replace(raw_config, reasoning_format="auto"))
    thinking, text = "".join(c.thinking for c in chunks), "".join(c.text for c in chunks)
    assert (thinking, text) == split_think(raw, started=bool(opens))
    assert thinking and text and "think>" not in thinking + text


def test_unknown_protocol_raises_before_anything_runs(server: Server) -> None:
    with server.open_session() as s:
        turn(s, "hi")
        before = s.explain_context()
        with pytest.raises(UnsupportedFeatureError) as info:
            s.decode(DecodeConfig(parser_protocols=("think", "no-such-protocol")))
        assert info.value.feature == "no-such-protocol"
        assert s.explain_context() == before
        assert answer(s, DecodeConfig(max_tokens=2, temperature=0.0)) is not None


# --- embeddings -----------------------------------------------------------------------------------

TEXTS = ["The cat sat on the mat.", "A kitten is sitting on a rug.",
         "Quarterly revenue grew by four percent.", "def add(a, b): return a + b"]


def test_session_embed(server: Server) -> None:
    with server.open_session() as s:
        turn(s, "hi")
        before = s.explain_context()
        matrix = s.embed(TEXTS)
        rows = np.stack([s.embed(text) for text in TEXTS])
        assert s.explain_context() == before  # the KV is not touched
    assert matrix.shape == rows.shape == (4, server.model.n_embd)
    assert matrix.dtype == rows.dtype == np.float32
    assert np.allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-5)
    assert np.allclose(matrix, rows, atol=1e-5), np.abs(matrix - rows).max()
    sims = matrix @ matrix[0]
    assert sims[1] > max(sims[2], sims[3]), sims
    with pytest.raises(SessionClosedError):
        s.embed("after close")


# --- LoRA on a shared server ------------------------------------------------------------------


def test_session_lora_on_a_shared_server(server: Server, tmp_path: Path) -> None:
    from llamapy.session import AdapterSpec, SessionConfig
    from llamapy.testing import write_random_lora

    path = write_random_lora(server.model_path, tmp_path / "a.gguf", rank=4, std=0.2, seed=1)
    with server.open_session(SessionConfig(cache_scope="lora-test")) as base:
        turn(base, "name a color")
        base_text = answer(base)
        base_manifest = base.manifest
    spec = AdapterSpec(path=str(path), scale=1.0)
    tuned_config = SessionConfig(cache_scope="lora-test", adapters=(spec,))
    with server.open_session(tuned_config) as tuned:
        status = tuned.ensure_prefix(PrefixInput(text=STABLE))
        assert status.reused_tokens == 0  # the base session's KV is never reused under LoRA
        tuned.prefill_suffix(SuffixInput(text="\nUser: name a color\nAssistant:"))
        tuned_text = answer(tuned)
        assert tuned.manifest.adapters and not base_manifest.adapters
        assert tuned.manifest.identity_digest != base_manifest.identity_digest
    assert tuned_text != base_text
    with server.open_session(tuned_config) as again:
        assert again.ensure_prefix(PrefixInput(text=STABLE)).reused_tokens > 0  # same set


def test_context_knobs_are_typed(server: Server) -> None:
    """A shared-server session refuses context sizing; a standalone one refuses sizing through
    context_options (both before anything is leased or created)."""
    for knob, value in (("n_ctx", 1024), ("n_batch", 64), ("context_options", {"n_ubatch": 8})):
        with pytest.raises(InvalidOptionError) as info:
            server.open_session(SessionConfig(**{knob: value}))
        assert info.value.option == knob
    with pytest.raises(InvalidOptionError) as info:
        open_standalone(server.model, SessionConfig(context_options={"n_seq_max": 2}))
    assert info.value.option == "n_seq_max"
    stats = server.stats()
    assert stats["slots_active"] == 0
