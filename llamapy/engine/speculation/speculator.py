"""Speculative decoding: drafts verified inside the normal tick.

After the planner lays out a tick's batch, :meth:`Speculator.extend` asks the drafters for
proposals for the decoding slots that speculate and appends them to those slots' decode
entries, within ``n_batch`` (the strategy's tokens come first; drafts use what is left). Each
such segment asks for an output row per position: the row after the last sampled token and one
after each drafted token. The executor then samples row by row with the request's own sampler
(:meth:`~llamapy.engine.executor.Executor`): while the sampled token equals the drafted one the
next row is valid too; the first token that differs (or the row after a fully accepted draft) is
the last one emitted, and the KV of the rejected positions is removed with ``seq_rm``.

Why the output never changes: every emitted token is drawn by the request's sampler from logits
computed on exactly the tokens that precede it, in the same order and with the same sampler
state (grammar, penalties, RNG) as without speculation. A draft is a point proposal, so this
*is* the rejection-sampling rule (accept a drafted ``x`` with probability ``p(x)``, else draw
from ``p`` without ``x``): greedy requests accept by argmax, sampled requests keep their exact
distribution (and, with a seed, their exact tokens). Stop strings, ``max_tokens``, EOG, grammar,
logprobs and streaming see the tokens one at a time, as always.

Adaptive (``adaptive=True``): the payoff of a draft of ``k`` tokens is ``E(k) / c(k)``: the
expected tokens a step emits, ``E(k) = 1 + a + ... + a^k`` for a per-token acceptance ``a``,
over the step's cost relative to a plain decode, ``c(k) = 1 + beta * k``. :class:`DecodeCost`
measures ``beta`` (the marginal cost of a batch token) from the engine's own decode timings:
about 0.3-0.5 for a small model on a few CPU cores, near 0 on a GPU. ``a`` pools two
estimates (decayed counts of accepted tokens and of rejections): the proposal's bucket across
requests (:class:`AcceptanceBook`: a 2-token n-gram match is a weaker proposal than a 12-token
one) and the request's own verifications. Each draft is cut to the ``k`` that maximises the
payoff (at most ``n_max``); a bucket that does not pay is only probed with one token every
:data:`EXPLORE_EVERY` opportunities; and a request whose own acceptance does not pay after
:data:`MIN_STEPS_BEFORE_OFF` verifications stops speculating: open-ended text stops paying for
drafts.

Few streams (``max_streams``, default 1): a tick with more requests decoding than that drafts
nothing, without asking the drafters. On a CPU, once several streams share each decode, a draft
token costs about what a stream's own token does, and the drafts' host-side work (lookups,
extra rows sampled) is not in the cost fit; measured on SmolLM2 with 2 threads, n-gram drafts
on open-ended text lost 13-21% at 4 and 16 streams although 69-84% of them were accepted.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from llamapy.engine.backend import Backend
from llamapy.engine.planner import ScheduledBatch
from llamapy.engine.request import Run
from llamapy.engine.speculation.drafting import Drafter, DraftJob, NgramDrafter
from llamapy.engine.stats import Counters
from llamapy.options.speculative import SpeculativeParams

__all__ = ["Speculation", "Speculator"]

#: Verification steps before the adaptive rule may switch speculation off.
MIN_STEPS_BEFORE_OFF = 6
#: Decay of the acceptance counts per verification step (recent steps weigh more).
ACCEPT_DECAY = 0.8
#: Largest decode the cost fit learns from (the sizes speculation chooses between).
MAX_FIT_TOKENS = 64
#: Durations kept per decode size.
SAMPLES_PER_SIZE = 8
#: Prior acceptance: as if 2 of 3 drafted tokens had been accepted.
PRIOR_ACCEPTED, PRIOR_REJECTED = 2.0, 1.0
#: Decay of a bucket's counts per verification (buckets see many requests).
BUCKET_DECAY = 0.95
#: A request whose own best payoff falls below this stops speculating.
OFF_PAYOFF = 0.9
#: A bucket that does not pay still gets a one-token draft every this many opportunities, so
#: its acceptance keeps being measured (text changes; a bucket never tried again never recovers).
EXPLORE_EVERY = 8


class DecodeCost:
    """The marginal cost of a batch token relative to a one-token decode (``beta``).

    Keeps the last :data:`SAMPLES_PER_SIZE` durations of decodes of each size ``n`` (up to
    :data:`MAX_FIT_TOKENS`: long prefill batches run at another per-token rate) and fits
    ``seconds = a + b * n`` through each size's median, weighted by its sample count: the many
    one-token decodes of a stream do not drown the few verification batches, and a slow first
    decode of a new batch shape (llama.cpp sizes its compute graph then) does not skew it."""

    def __init__(self, prior_beta: float) -> None:
        self.prior_beta = prior_beta
        self._samples: dict[int, deque[float]] = {}
        self._fit: tuple[float, float] | None = None
        self._flat = False  # a fit whose line does not rise: every size costs one pass
        self._stale = False

    def record(self, n_tokens: int, seconds: float) -> None:
        """Add one decode's size and duration."""
        if 0 < n_tokens <= MAX_FIT_TOKENS:
            self._samples.setdefault(n_tokens, deque(maxlen=SAMPLES_PER_SIZE)).append(seconds)
            self._stale = True

    @property
    def beta(self) -> float:
        """``b / (a + b)``, clamped to [0.01, 1]; the prior until two sizes were seen."""
        return self.beta_for(1)

    def beta_for(self, n_decoding: int) -> float:
        """The cost of one more batch token in units of a generated token when
        ``n_decoding`` streams share each decode: ``b / ((a + n b) / n)``, clamped to
        [0.01, 1]. A draft token slows every stream of the batch, so it must pay for itself
        against the batch's own cost per token, which falls as streams are added."""
        fit = self.fit()
        if fit is None:
            return self.prior_beta
        a, b = fit
        n = max(1, n_decoding)
        return min(1.0, max(0.01, b * n / (a + n * b)))

    @property
    def pass_tokens(self) -> float:
        """``a / b``: batch tokens that cost as much as a decode pass's fixed cost, at most
        :data:`MAX_FIT_TOKENS` (the sizes the fit has seen; past them it would guess); that
        cap too when every size costs a pass alike (a flat or falling line: a GPU's step); 0
        until the fit is known."""
        fit = self.fit()
        if fit is None:
            return float(MAX_FIT_TOKENS) if self._flat else 0.0
        return min(float(MAX_FIT_TOKENS), max(0.0, fit[0] / fit[1]))

    def fit(self) -> tuple[float, float] | None:
        """``(a, b)`` of ``seconds = a + b * n``; None until two sizes were seen or when the
        fit is nonsense (no positive slope, ``a + b <= 0``). Kept until a decode is added."""
        if self._stale:
            line, self._stale = self._fit_now(), False
            self._fit = line if line is not None and line[1] > 0 and sum(line) > 0 else None
            self._flat = line is not None and line[1] <= 0 < line[0]
        return self._fit

    def _fit_now(self) -> tuple[float, float] | None:
        points = [(n, statistics.median(ts), len(ts)) for n, ts in self._samples.items()]
        if len(points) < 2:
            return None
        w = sum(c for _, _, c in points)
        sn = sum(c * n for n, _, c in points)
        st = sum(c * t for _, t, c in points)
        snn = sum(c * n * n for n, _, c in points)
        snt = sum(c * n * t for n, t, c in points)
        b = (w * snt - sn * st) / (w * snn - sn * sn)
        a = (st - b * sn) / w
        return a, b


def best_draft_len(acceptance: float, beta: float, n_max: int) -> tuple[int, float]:
    """The draft length ``k`` in ``1..n_max`` maximising ``E(k) / (1 + beta k)``, and that
    payoff (see the module docstring)."""
    best_k, best, expected, term = 1, 0.0, 1.0, 1.0
    for k in range(1, max(1, n_max) + 1):
        term *= acceptance
        expected += term
        payoff = expected / (1.0 + beta * k)
        if payoff > best:
            best_k, best = k, payoff
    return best_k, best


class AcceptanceBook:
    """Acceptance learned per proposal bucket across requests (decayed counts of accepted
    tokens and of rejections): a 2-token n-gram match is a weaker proposal than a 12-token one,
    and a model draft is another thing again. Only counts are kept, never text."""

    def __init__(self) -> None:
        self._counts: dict[Hashable, list[float]] = {}

    def counts(self, bucket: Hashable) -> list[float]:
        """``[accepted, rejections, opportunities]`` of ``bucket`` (the prior if new)."""
        counts = self._counts.get(bucket)
        if counts is None:
            counts = self._counts[bucket] = [PRIOR_ACCEPTED, PRIOR_REJECTED, 0.0]
        return counts

    def record(self, bucket: Hashable, drafted: int, accepted: int) -> None:
        """Account one verification of a draft from ``bucket``."""
        counts = self.counts(bucket)
        counts[0] = BUCKET_DECAY * counts[0] + accepted
        counts[1] = BUCKET_DECAY * counts[1] + (accepted < drafted)


@dataclass(slots=True)
class Speculation:
    """One request's speculation state and measurements."""

    params: SpeculativeParams
    n_cur: int = 0
    active: bool = True
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    hits: float = 0.0
    misses: float = 0.0

    def __post_init__(self) -> None:
        self.n_cur = self.params.n_max

    @property
    def acceptance(self) -> float:
        """This request's own estimate of the chance a drafted token is accepted (its counts
        over the prior's, which fade as evidence comes in)."""
        prior = ACCEPT_DECAY ** self.steps
        hits = self.hits + prior * PRIOR_ACCEPTED
        return hits / (hits + self.misses + prior * PRIOR_REJECTED)

    def record(self, drafted: int, accepted: int) -> None:
        """Account one verification step."""
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        while len(self.accepted_per_pos) < accepted:
            self.accepted_per_pos.append(0)
        for i in range(accepted):
            self.accepted_per_pos[i] += 1
        self.hits = ACCEPT_DECAY * self.hits + accepted
        self.misses = ACCEPT_DECAY * self.misses + (accepted < drafted)

    def judge(self, beta: float) -> None:
        """Adaptive: switch off for good once this request's own acceptance does not pay."""
        if not self.params.adaptive or self.steps < MIN_STEPS_BEFORE_OFF:
            return
        if best_draft_len(self.acceptance, beta, self.params.n_max)[1] < OFF_PAYOFF:
            self.active = False


class Speculator:
    """Attaches drafts to a batch's decode entries and accounts their verification."""

    def __init__(self, backend: Backend, counters: Counters, drafters: Mapping[str, Drafter],
                 defaults: SpeculativeParams, prior_beta: float) -> None:
        self.backend = backend
        self.counters = counters
        self.drafters = dict(drafters)
        self.defaults = defaults
        self.cost = DecodeCost(prior_beta)
        self.book = AcceptanceBook()

    def start(self, run: Run) -> None:
        """Give ``run`` its speculation state if its settings turn speculation on."""
        params = self.defaults.merged(run.request.options.speculative)
        usable = [t for t in params.type if t in self.drafters]
        if not params.enabled or not usable or run.prefill_only or run.request.media \
                or not self.backend.supports_partial_removal:
            return
        run.spec = Speculation(params)

    def extend(self, batch: ScheduledBatch, n_batch: int, n_ctx_seq: int) -> None:
        """Append drafts to ``batch``'s decode entries of speculating runs, within ``n_batch``
        (and never past ``max_tokens`` or the sequence's context)."""
        room = n_batch - batch.n_tokens
        decoding = sum(not e.prefill for e in batch.entries)
        beta: float | None = None  # the cost fit, only once a run speculates this tick
        jobs: list[DraftJob] = []
        for entry in batch.entries:
            spec = entry.run.spec
            if room <= 0 or entry.prefill or spec is None or not spec.active \
                    or 0 < spec.params.max_streams < decoding:
                continue
            if beta is None:
                beta = self.cost.beta_for(decoding)
            run = entry.run
            left = min(run.request.options.max_tokens - run.num_generated - 1,
                       n_ctx_seq - len(entry.slot.cached) - 2)
            n = min(spec.params.n_max, room, left)
            if n >= max(1, spec.params.n_min):
                jobs.append(DraftJob(entry.slot, run, n, length=self._policy(spec, beta)))
        if not jobs:
            return
        self._propose(jobs)
        by_slot = {job.slot.slot_id: job for job in jobs}
        for entry in batch.entries:
            job = by_slot.get(entry.slot.slot_id)
            spec = entry.run.spec
            if job is None or spec is None:
                continue
            draft = job.tokens[:min(job.worth(job.bucket), room)]
            if job.bucket is not None:  # a proposal was possible (perhaps not worth it)
                self.book.counts(job.bucket)[2] += 1
            if len(draft) < max(1, spec.params.n_min):  # also when cut to fit n_batch
                continue
            room -= len(draft)
            spec.n_cur = len(draft)
            entry.draft, entry.draft_tag, entry.draft_bucket = draft, job.source, job.bucket
            entry.token_ids = [*entry.token_ids, *draft]

    def _policy(self, spec: Speculation, beta: float) -> Callable[[Hashable], int]:
        """How many tokens of a proposal of a bucket ``spec``'s request should verify."""
        def length(bucket: Hashable) -> int:
            if not spec.params.adaptive:
                return spec.params.n_max
            return self.draft_len(bucket, spec, beta)
        return length

    def draft_len(self, bucket: Hashable, spec: Speculation, beta: float | None = None) -> int:
        """The draft length that pays best for a proposal of ``bucket`` to ``spec``'s
        request: acceptance pooled from the bucket and the request, cost from ``beta``; a
        bucket that does not pay gets a one-token probe every :data:`EXPLORE_EVERY` tries."""
        counts = self.book.counts(bucket)
        total = counts[0] + counts[1] + spec.hits + spec.misses
        k, payoff = best_draft_len((counts[0] + spec.hits) / total,
                                   self.cost.beta if beta is None else beta, spec.params.n_max)
        if payoff >= 1.0:
            return max(k, spec.params.n_min)  # n_min is the user's floor for a verified draft
        return 1 if int(counts[2]) % EXPLORE_EVERY == 0 else 0

    def _propose(self, jobs: list[DraftJob]) -> None:
        """Ask each drafter, in each run's order, for the jobs still without a draft."""
        order: list[str] = []
        for job in jobs:
            assert job.run.spec is not None
            order += [t for t in job.run.spec.params.type if t not in order]
        for name in order:
            drafter = self.drafters.get(name)
            wanting = [j for j in jobs if not j.tokens and j.run.spec is not None
                       and name in j.run.spec.params.type]
            if drafter is not None and wanting:
                drafter.propose(wanting)

    def verified(self, run: Run, drafted: int, accepted: int, bucket: Hashable = None
                 ) -> None:
        """Account a verification step of ``run`` (counters, timings, adaptation) of a draft
        from ``bucket``."""
        spec = run.spec
        assert spec is not None, "verified: run does not speculate"
        spec.record(drafted, accepted)
        self.book.record(bucket, drafted, accepted)
        spec.judge(self.cost.beta)
        c = self.counters
        c.num_draft_tokens += drafted
        c.num_draft_accepted += accepted
        c.num_draft_steps += 1
        while len(c.draft_accepted_per_pos) < accepted:
            c.draft_accepted_per_pos.append(0)
        for i in range(accepted):
            c.draft_accepted_per_pos[i] += 1
        run.timings.draft_tokens = spec.drafted
        run.timings.draft_accepted = spec.accepted

    def finished(self, run: Run) -> None:
        """Let the drafters learn from / forget ``run``."""
        if run.spec is None:
            return
        for name in run.spec.params.type:
            drafter = self.drafters.get(name)
            if drafter is not None:
                drafter.finished(run)

    def close(self) -> None:
        """Close every drafter."""
        for drafter in self.drafters.values():
            drafter.close()


def with_ngram(ngram_size: int, extra: Mapping[str, Drafter] | None) -> dict[str, Drafter]:
    """The built-in n-gram drafter plus ``extra`` drafters (by name)."""
    drafters: dict[str, Drafter] = {"ngram": NgramDrafter(ngram_size)}
    drafters.update(extra or {})
    return drafters


def trim_to_run(backend: Backend, run: Run, seq_id: int, cached: list[int]) -> None:
    """Drop the KV of rejected draft positions: ``cached`` becomes ``run.tokens[:-1]``."""
    keep = len(run.tokens) - 1
    if len(cached) > keep:
        backend.seq_rm(seq_id, keep, -1)
        del cached[keep:]

