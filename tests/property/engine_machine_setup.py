"""What the engine's property machine (``test_engine_machine``) draws from: the prompt
prefixes, keys, pins, stops, speculation overrides and faults its rules pick, a user batch
strategy, the engine setups, and the shadow it keeps of each request."""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Any

from hypothesis import event
from hypothesis import strategies as st

from llamapy.engine import BatchDecision, BatchView, Counters, DecodeMaximal, SamplingParams
from llamapy.engine.testing import Recorder

PREFIXES: tuple[list[int], ...] = (
    [], [1, 2, 3, 1, 2, 3, 1, 2], [1, 2, 3, 3, 2, 1, 1, 2, 3, 3, 2, 1],
    [1, 2, 3, 3, 2, 1, 1, 2, 3, 3, 2, 1, 2, 2], [2, 2, 1])
SCOPES = (None, None, "a", "b")
#: Media a prompt may hold (bytes the fake projector turns into 2 to 8 rows).
IMAGES = (b"cat", b"dog", b"a longer picture")
IDENTITIES = ("", "", "lora")
ADAPTER_SETS = ((), (), (("a.gguf", 1.0),), (("b.gguf", 0.5),),
                (("a.gguf", 1.0), ("b.gguf", 0.5)))
STRATEGIES = ("decode_maximal", "prefill_priority", "balanced", "shortest_first",
              "shortest_prompt_first")
#: Pinned prefixes: none, short, two of them (one expiring within a few decodes), too long.
CACHE_PINS = ((), (), ((4, 300),), ((5, 0.05), (12, 3600)), ((100, 300),))
STOPS = ((), (), ("w1",), ("\n", "é"), ("w3 w",))
SPECULATIVE = (None, None, None, "off", False, "ngram", "draft", {"n_max": 2},
               {"type": "draft,ngram", "n_max": 3, "adaptive": False}, {"n_min": 2})
FAULTS = ("decode_error", "abort", "kv_full", "restore_fail", "slow", "invalid_batch",
          "sample_error")


class ShortestPromptFirst(DecodeMaximal):
    """A user strategy: admit and prefill the shortest prompts first."""

    name = "shortest_prompt_first"

    def admission_order(self, queue, now):
        return sorted(range(len(queue)), key=lambda i: (queue[i].prompt_tokens, i))

    def allocate(self, view: BatchView) -> BatchDecision:
        decision = BatchDecision(decode=[s.slot_id for s in view.decoding][: view.n_batch])
        budget = view.n_batch - len(decision.decode)
        for slot in sorted(view.prefilling, key=lambda s: (s.remaining_prefill, s.serial)):
            n = min(budget, view.chunk_for(slot))
            if n <= 0:
                break
            decision.prefill[slot.slot_id] = n
            budget -= n
        return decision


@dataclass
class Shadow:
    """What the test expects of one submitted request."""

    rid: int
    prompt: list[int]
    max_tokens: int
    params: SamplingParams
    stop: tuple[str, ...]
    adapters: tuple
    key: tuple
    sink: Recorder = field(default_factory=Recorder)
    media: tuple = ()


@st.composite
def engine_setups(draw: st.DrawFn) -> dict:
    n_parallel = draw(st.integers(1, 3))
    unified = draw(st.sampled_from([True, True, False]))
    per_seq = draw(st.sampled_from([16, 28, 48, 96]))
    return dict(
        n_parallel=n_parallel, unified=unified, partial=draw(st.sampled_from([True, True, False])),
        n_ctx=per_seq if unified else per_seq * n_parallel,
        n_batch=draw(st.integers(3, 40)), chunk_size=draw(st.integers(1, 16)),
        max_queue=draw(st.integers(0, 4)), ram_mb=draw(st.sampled_from([0, 0.0008, 0.004])),
        disk_mb=draw(st.sampled_from([0, 0, 0.004, 0.03])),
        strategy=draw(st.sampled_from(STRATEGIES)),
        cache_prompt=draw(st.sampled_from([True, True, False])),
        dedup=draw(st.sampled_from([True, True, False])),
        spec=draw(st.sampled_from(["off", "draft", "ngram,draft", "ngram"])),
        spec_error_rate=draw(st.sampled_from([0.0, 0.3, 0.9])),
        spec_n_max=draw(st.integers(1, 6)), spec_adaptive=draw(st.booleans()),
        spec_max_streams=draw(st.sampled_from([0, 1, 2])),
        device=draw(st.booleans()),  # the async device: text and events overlap the next step
        # (checkpoints matter with partial=False: the fake's state then only restores)
        ctx_checkpoints=draw(st.sampled_from([0, 2, 32])),
        checkpoints_mb=draw(st.sampled_from([0.0011, 1.0])),  # (~2 of the fake's, or many)
        checkpoint_step=draw(st.sampled_from([0, 2, 5])),
    )


#: Counters whose use an example is labelled with.
LABELLED_COUNTERS = (
    "num_reused_own", "num_reused_donor", "num_reused_ram", "num_reused_disk",
    "num_disk_restores", "num_disk_failures", "num_reused_inflight", "num_kv_pressure_events",
    "num_purged_slots", "num_batch_splits", "num_context_overflows", "num_ram_restores",
    "num_ram_restore_failures", "num_instability_events", "num_checkpoint_restores")


def report_events(counters: Counters, adapter_switches: int, spec: str,
                  ngram_proposed: int) -> None:
    """Label what an example exercised (shown by --hypothesis-show-statistics)."""
    for reason in counters.finish_reasons:
        event(f"finish {reason}")
    if adapter_switches > 1:
        event("adapter sets interleaved")
    event(f"speculation {spec}")
    if counters.num_draft_accepted:
        event("drafts accepted")
    if counters.num_draft_tokens > counters.num_draft_accepted:
        event("drafts rejected")
    if ngram_proposed:
        event("n-gram drafts proposed")
    flat = counters.flat()
    for name in LABELLED_COUNTERS:
        if flat[name]:
            event(name)


def check_plans(backend: Any, n_batch: int, chunk_size: int) -> None:
    """The recorded plans keep the batch rules (then forgotten): each decode within
    ``n_batch``, each prefill chunk within ``chunk_size`` (a bidirectional media chunk whole),
    one adapter set a plan, drafts of the plan's own key, text and media never in one segment,
    no media segment asking for logits; and the fake backend saw no violation."""
    for plan in backend.plans:
        assert max(plan.decodes()) <= n_batch
        for seg in plan.segments:
            draft = seg.n_outputs - 1  # a decode's verified draft; not a prefill chunk
            assert draft == 0 or (seg.logits and len(seg.token_ids) == 1 + draft)
            whole = seg.media is not None and not seg.media.chunk.causal
            assert whole or len(seg.token_ids) - draft <= chunk_size
            assert seg.tag[2] == plan.adapter_set, "a plan mixes adapter sets"
            assert seg.draft_tag in (None, seg.tag), "a draft from another key"
            media = [t < 0 for t in seg.token_ids]
            assert all(media) == (seg.media is not None) and (all(media) or not any(media)), \
                "a segment mixes text and media"
            assert seg.media is None or not seg.logits, "a media segment asks for logits"
    assert not backend.violations, backend.violations
    backend.plans.clear()


def check_oracle(backend: Any, shadow: Shadow) -> None:
    """A finished request's tokens are the reference's (a prefix of them when it stopped
    early), and its text is theirs."""
    sink = shadow.sink
    reason = sink.finish_reason
    expected = backend.model.reference(shadow.prompt, shadow.max_tokens, shadow.params,
                                       shadow.adapters)
    got = sink.tokens
    if reason in ("eog", "max_tokens"):
        assert got == expected, f"request {shadow.rid}: {got} != reference {expected}"
    else:
        assert got == expected[: len(got)], f"request {shadow.rid}: not a prefix of reference"
    if reason == "prefill":
        assert shadow.max_tokens == 0 and not got
    if reason in ("eog", "max_tokens", "stop"):
        pieces = b"".join(backend.token_to_piece(t) for t in sink.tokens)
        full = codecs.decode(pieces, "utf-8", errors="replace")
        if reason == "stop":
            word = sink.final.stop_word
            assert word in shadow.stop and sink.text == full[: full.find(word)]
        else:
            assert sink.text == full
            assert not any(word in sink.text for word in shadow.stop)
