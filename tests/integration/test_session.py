"""Workspace sessions on the real default model (short: few tokens, small contexts)."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from llamapy.errors import ContextOverflowError, ManifestMismatchError
from llamapy.server import Server
from llamapy.session import DecodeConfig, PrefixInput, SessionSnapshot, SuffixInput

STABLE = "You are a careful coding assistant. Repository map: src/a.py src/b.py tests/t.py. " * 3
GREEDY = DecodeConfig(max_tokens=8, temperature=0.0)


def answer(session: object, config: DecodeConfig = GREEDY) -> str:
    chunks = list(session.decode(config))  # type: ignore[attr-defined]
    assert all(c.error is None for c in chunks), chunks
    return "".join(c.text for c in chunks)


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
