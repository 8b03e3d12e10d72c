"""``ModelDrafter``: a smaller model with the same vocabulary proposes drafts greedily.

It owns a second :class:`~llamapy.engine.backend.Backend` (its own context) with one sequence
per target slot, and keeps each sequence in step with its slot lazily: before drafting, the
draft sequence keeps the longest prefix it shares with the request's tokens (the rest is removed
with ``seq_rm``) and computes the missing tail, which after a verification is just the accepted
tokens. All drafting slots are batched together: one decode for the tails, then one decode per
draft position. A sequence is emptied when its slot starts serving another cache key (nothing
computed for one tenant is kept in step for another).

Drafting stops early for a slot when the draft model's own probability of its greedy token is
below ``p_min``. Any decode failure of the draft backend empties its sequences and the tick goes
on without drafts (the target never depends on the drafter).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Sequence

from llamapy.engine.backend import Backend, BatchPlan, Sampler, Segment
from llamapy.engine.cache.ram import common_prefix
from llamapy.engine.request import Run
from llamapy.engine.speculation.drafting import DraftJob
from llamapy.errors import InvalidOptionError, LlamapyError
from llamapy.options.sampling import SamplingParams

__all__ = ["ModelDrafter", "check_same_vocab"]

log = logging.getLogger("llamapy.engine")

#: The one acceptance bucket of model drafts.
BUCKET = ("draft",)


def check_same_vocab(target: Backend, draft: Backend, probes: int = 64) -> None:
    """``InvalidOptionError`` unless ``draft`` tokenizes like ``target`` (same size, and the
    same pieces for a spread of token ids)."""
    if target.n_vocab != draft.n_vocab:
        raise InvalidOptionError(f"draft model vocabulary ({draft.n_vocab} tokens) differs from "
                                 f"the model's ({target.n_vocab})", option="spec_draft_model")
    step = max(1, target.n_vocab // probes)
    for token in range(0, target.n_vocab, step):
        if target.token_to_piece(token) != draft.token_to_piece(token):
            raise InvalidOptionError(f"draft model renders token {token} differently: not the "
                                     "same vocabulary", option="spec_draft_model")


class ModelDrafter:
    """Greedy drafts from a draft model's backend (see the module docstring)."""

    name = "draft"

    def __init__(self, backend: Backend, p_min: float = 0.0) -> None:
        self.backend = backend
        self.p_min = p_min
        self._greedy: Sampler | None = backend.new_sampler(SamplingParams(temp=0.0))
        self._cached: list[list[int]] = [[] for _ in range(backend.n_seq_max)]
        self._keys: list[Hashable] = [None] * backend.n_seq_max
        self.num_decode_calls = 0

    def propose(self, jobs: Sequence[DraftJob]) -> None:
        """Draft for every unfilled job whose slot has a draft sequence (as many tokens as
        the job's policy finds worth verifying)."""
        jobs = [j for j in jobs if not j.tokens and j.slot.seq_id < len(self._cached)]
        for job in jobs:
            job.n_max, job.bucket = job.worth(BUCKET), BUCKET
        jobs = [j for j in jobs if j.n_max > 0]
        if not jobs or self._greedy is None:
            return
        try:
            rows = self._catch_up(jobs)
            self._draft(jobs, rows)
        except LlamapyError as exc:
            log.warning("draft model failed (%r); drafting resumes from scratch", exc)
            self.backend.clear()
            self._cached = [[] for _ in self._cached]
            for job in jobs:
                job.tokens = []

    def _catch_up(self, jobs: Sequence[DraftJob]) -> dict[int, int]:
        """Bring each job's draft sequence to its run's tokens; the output row of each."""
        tails: list[tuple[DraftJob, list[int]]] = []
        for job in jobs:
            seq, tokens = job.slot.seq_id, job.run.tokens
            if self._keys[seq] != job.run.key:
                self._trim(seq, 0)
                self._keys[seq] = job.run.key
            keep = min(common_prefix(self._cached[seq], tokens), len(tokens) - 1)
            self._trim(seq, keep)
            tails.append((job, list(tokens[keep:])))
        return self._decode_tails(tails)

    def _decode_tails(self, tails: list[tuple[DraftJob, list[int]]]) -> dict[int, int]:
        """Decode every tail but its last token in batches of at most ``n_batch`` tokens, then
        all the last tokens in one decode with logits; slot id -> output row."""
        pending = [(job, tail[:-1]) for job, tail in tails if len(tail) > 1]
        while pending:
            plan, rest = BatchPlan(), []
            for job, tail in pending:
                take = max(0, self.backend.n_batch - plan.n_tokens)
                if take:
                    self._add(plan, job, tail[:take], logits=False)
                if tail[take:]:
                    rest.append((job, tail[take:]))
            self._decode(plan)
            pending = rest
        plan = BatchPlan()
        for job, tail in tails:
            self._add(plan, job, tail[-1:], logits=True)
        self._decode(plan)
        return {seg.seq_id: i for i, seg in enumerate(plan.segments)}

    def _add(self, plan: BatchPlan, job: DraftJob, tokens: list[int], *, logits: bool) -> None:
        seq = job.slot.seq_id
        plan.segments.append(Segment(seq, len(self._cached[seq]), tokens, logits, job.run.key))
        self._cached[seq].extend(tokens)

    def _draft(self, jobs: Sequence[DraftJob], rows: dict[int, int]) -> None:
        """Greedy steps for every job at once until each has ``n_max`` tokens or stops."""
        active = [j for j in jobs if j.slot.seq_id in rows]
        while active:
            plan, nxt = BatchPlan(), []
            for job in active:
                seq = job.slot.seq_id
                token = self._pick(rows[seq])
                if token is None:
                    continue
                job.tokens.append(token)
                job.source = job.run.key
                if len(job.tokens) < job.n_max and not self.backend.is_eog(token):
                    self._add(plan, job, [token], logits=True)
                    nxt.append(job)
            if not nxt:
                return
            self._decode(plan)
            rows = {job.slot.seq_id: i for i, job in enumerate(nxt)}
            active = nxt

    def _pick(self, row: int) -> int | None:
        """The greedy token of ``row``, or None when it is less likely than ``p_min``."""
        assert self._greedy is not None
        token = self._greedy.sample(row)
        if self.p_min > 0.0 and math.exp(self._greedy.token_logprob(row, token)) < self.p_min:
            return None
        return token

    def _decode(self, plan: BatchPlan) -> None:
        self.backend.decode(plan)
        self.num_decode_calls += 1

    def _trim(self, seq: int, keep: int) -> None:
        if len(self._cached[seq]) > keep:
            self.backend.seq_rm(seq, keep, -1)
            del self._cached[seq][keep:]

    def finished(self, run: Run) -> None:
        """Nothing to forget: sequences follow their slots."""

    def close(self) -> None:
        """Free the greedy sampler (the backend stays its owner's); idempotent."""
        if self._greedy is not None:
            self._greedy.close()
            self._greedy = None
