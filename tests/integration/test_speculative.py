"""Speculative decoding on the real model: what is generated does not change.

llama.cpp's CPU kernels are not batch-invariant: the logits of a position computed in a
one-token decode and in a multi-token batch differ slightly (up to ~0.7 here on SmolLM2 Q4_1),
so two greedy runs can part at a near-tie whatever the scheduler does (with 4 concurrent
requests, plain continuous batching does it too). The tests therefore require greedy outputs to
agree token for token until they part, that they part only where the reference run's top-2
log-probability gap is below :data:`NEAR_TIE` (a wrong row, KV cell or sampler state parts them
at a decisive token), and that the agreeing stretch is long.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from llamapy.runtime.client import Completion
from llamapy.server import Server

#: Top-2 log-probability gap below which batch-shape noise may flip a greedy choice.
NEAR_TIE = 1.5

CODE = '''def merge_intervals(intervals):
    """Merge overlapping [start, end] intervals and return them sorted."""
    if not intervals:
        return []
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = [list(ordered[0])]
    for start, end in ordered[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    return merged
'''
PARAGRAPH = ("The library opens at nine in the morning and closes at six in the evening. "
             "Visitors may borrow up to five books at a time, and each loan lasts three weeks. "
             "Late returns cost ten cents per day, and lost books must be replaced.")
PROMPTS = [
    f"Rewrite this function exactly, renaming `merged` to `result`:\n\n{CODE}",
    f"Repeat this paragraph word for word, but change 'five' to 'six':\n\n{PARAGRAPH}",
    f"Copy this code without any change:\n\n{CODE}",
    "Write a short story about a lighthouse keeper.",
]


def chat(text: str) -> str:
    """The prompt of one user turn in the model's chat format."""
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def agreement(reference: Completion, other: Completion) -> int:
    """Leading tokens ``other`` shares with ``reference``; ``AssertionError`` when they part
    at a token the reference chose by a clear margin."""
    for i, (a, b) in enumerate(zip(reference.token_ids, other.token_ids, strict=False)):
        if a != b:
            top = reference.logprobs[i]
            assert top[0][1] - top[1][1] < NEAR_TIE, (i, top, reference.text, other.text)
            return i
    assert len(reference.token_ids) == len(other.token_ids), (reference.text, other.text)
    return len(reference.token_ids)


def run_all(server: Server, prompts: list[str], **options: object) -> list[Completion]:
    """All prompts at once (one thread each), greedy, in submission order."""
    out: list[Completion | None] = [None] * len(prompts)

    def one(i: int) -> None:
        out[i] = server.complete(chat(prompts[i]), max_tokens=96, temp=0.0, n_probs=2,
                                 timeout=600, **options)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(c is not None for c in out)
    return out  # type: ignore[return-value]


def copied(prompt: list[int], output: list[int], n: int = 4) -> int:
    """Output tokens that a prompt lookup of ``n`` tokens predicts: the ``n`` tokens before
    each (prompt, then output) occurred earlier, last followed by that very token."""
    seq, hits = list(prompt), 0
    for token in output:
        key = seq[-n:]
        for j in range(len(seq) - n - 1, -1, -1):
            if seq[j:j + n] == key:
                hits += seq[j + n] == token
                break
        seq.append(token)
    return hits


@pytest.mark.parametrize("n_parallel", [1, 4])
def test_greedy_output_is_unchanged_by_ngram_speculation(model_path: Path, n_parallel: int
                                                         ) -> None:
    runs, drafted = [], []
    for spec in ("off", "ngram"):
        # not adaptive: how much is drafted then depends on the text alone, never on timings
        # and at any number of streams (the default drafts only while one decodes)
        with Server(model_path, n_ctx=4096, n_parallel=n_parallel, spec_type=spec,
                    spec_adaptive=False, spec_max_streams=0) as srv:
            runs.append(run_all(srv, PROMPTS))
            drafted.append(srv.call(lambda e: (e.counters.num_draft_tokens,
                                               e.counters.num_draft_accepted)))
            prompts = [srv.tokenize(chat(p)) for p in PROMPTS]
    agreed = sum(agreement(ref, spec) for ref, spec in zip(*runs, strict=True))
    assert agreed >= 15 * len(PROMPTS), agreed  # a long stretch was compared
    assert drafted[0] == (0, 0)
    # input-grounded text is drafted and accepted: at least half of the tokens a 4-token
    # prompt lookup predicts (the rest: a bonus token after each full draft, or a rejection)
    lookup = sum(copied(p, c.token_ids) for p, c in zip(prompts, runs[1], strict=True))
    assert lookup >= 40, lookup  # the prompts ask for copies, and the model makes them
    assert drafted[1][1] >= lookup // 2, (drafted, lookup)


def test_per_request_override_and_timings(model_path: Path) -> None:
    with Server(model_path, n_ctx=4096, n_parallel=2) as srv:  # server default: off
        prompt = chat(PROMPTS[2])
        off = srv.complete(prompt, max_tokens=96, temp=0.0)
        on = srv.complete(prompt, max_tokens=96, temp=0.0, speculative={"type": "ngram",
                                                                         "n_max": 4,
                                                                         "adaptive": False})
        assert off.timings.draft_tokens == 0
        assert on.timings.draft_tokens > 0
        assert on.timings.draft_accepted > on.timings.draft_tokens // 2
        steps = srv.call(lambda e: e.counters.num_draft_steps)
        assert on.timings.draft_tokens <= 4 * steps  # n_max bounds every draft


def test_self_drafting_with_the_same_model_accepts_nearly_all(model_path: Path) -> None:
    with Server(model_path, n_ctx=4096, n_parallel=2, spec_draft_model=str(model_path),
                spec_adaptive=False) as srv:
        # one after the other: the same batch shapes every run, so the same acceptance
        out = [srv.complete(chat(p), max_tokens=96, temp=0.0, timeout=600)
               for p in (PROMPTS[0], PROMPTS[2])]
        stats = srv.call(lambda e: (e.counters.num_draft_tokens, e.counters.num_draft_accepted))
    drafted, accepted = stats
    assert all(c.completion_tokens > 20 for c in out)
    assert drafted > 40
    # same weights: a draft is rejected only where batch-shape noise flips a near-tie (none
    # here, run alone: 133-134 of 133-134 accepted in repeated runs)
    assert accepted >= 0.9 * drafted, stats


def test_sampled_requests_with_a_seed_are_reproducible(model_path: Path) -> None:
    """A seeded sampled request draws its tokens with its own sampler, row by row, so with
    speculation it repeats exactly (and drafts still get accepted)."""
    results = []
    for _ in range(2):
        with Server(model_path, n_ctx=4096, n_parallel=1, spec_type="ngram",
                    spec_adaptive=False) as srv:  # the same drafts, so the same batch shapes
            results.append(srv.complete(chat(PROMPTS[1]), max_tokens=96, temp=0.7, seed=1234))
    first, second = results
    assert first.token_ids == second.token_ids
    assert first.timings.draft_accepted > 0


def test_a_session_drafts_from_its_stable_prefix(model_path: Path) -> None:
    """The n-gram drafter looks up the whole resident sequence, so code kept in a session's
    stable prefix is drafted when the model rewrites it; the session's KV stays consistent."""
    with Server(model_path, n_ctx=4096, n_parallel=2) as srv, srv.open_session() as session:
        session.ensure_prefix(f"<|im_start|>system\nYou copy code.<|im_end|>\n"
                              f"<|im_start|>user\nHere is a file:\n\n{CODE}<|im_end|>\n")
        session.prefill_suffix("<|im_start|>user\nCopy the file exactly.<|im_end|>\n"
                               "<|im_start|>assistant\n")
        text = "".join(c.text for c in session.decode(max_tokens=96, temperature=0,
                                                      speculative={"type": "ngram",
                                                                   "adaptive": False}))
        drafted, accepted = srv.call(lambda e: (e.counters.num_draft_tokens,
                                                e.counters.num_draft_accepted))
        report = session.explain_context()
        assert text and accepted > 10 and accepted <= drafted
        assert report.resident_tokens == (report.prefix_tokens + report.suffix_tokens
                                          + report.generated_tokens)
        more = "".join(c.text for c in session.decode(max_tokens=8, temperature=0,
                                                      speculative=False))
        assert more and srv.call(lambda e: e.counters.num_draft_tokens) == drafted
