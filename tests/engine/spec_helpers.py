"""Helpers for speculative decoding tests on the fake backend.

Drafters whose proposals are known (:class:`OracleDrafter`: the fake model's true continuation,
corrupted at a seeded rate; :class:`LeakyDrafter`: claims its text came from another cache key;
:class:`AuditedNgramDrafter`: the built-in n-gram drafter, proving each proposal is text of the
request's own cache key), an engine factory with a simulated clock (so the measured decode cost
is deterministic), and runners that compare events with and without speculation. Self-contained
(only ``llamapy`` imports) so the stateful machine in ``tests/property`` can use it too.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from llamapy.engine import (
    BatchPlan,
    CostModel,
    DoneEvent,
    Engine,
    EngineConfig,
    EngineTuning,
    FakeBackend,
    FakeModel,
    Request,
    RequestOptions,
    SamplingParams,
    TokenEvent,
)
from llamapy.engine.fake.model import adapter_salt, chain_hash
from llamapy.engine.request import CacheKey, Run
from llamapy.engine.speculation.drafting import DraftJob, NgramDrafter
from llamapy.engine.testing import Recorder, drain

#: A decode costs 10 ms plus 3 ms per batch token: beta = 3 / 13 (a small model on a CPU).
CPU_COST = CostModel(step_s=0.010, token_s=0.003)
#: A decode costs the same whatever its size (beta clamps to its floor, 0.01).
GPU_COST = CostModel(step_s=0.010, token_s=0.000001)
#: The acceptance bucket of the oracle's proposals.
ORACLE_BUCKET = ("oracle",)


def true_continuation(model: FakeModel, run: Run, n: int) -> list[int]:
    """The ``n`` tokens ``run`` will generate next (its sampler's draws, chained past EOG)."""
    params = run.request.options.sampling
    salt = adapter_salt(run.adapter_set)
    h = model.history_hash(run.tokens, run.adapter_set)
    out: list[int] = []
    for _ in range(n):
        token = model.next_token(h, params)
        out.append(token)
        h = chain_hash(h, token, salt)
    return out


@dataclass(slots=True, frozen=True)
class Proposal:
    """What a drafter was asked for and what it proposed."""

    request_id: Hashable
    num_generated: int
    n_max: int
    tokens: tuple[int, ...]


class OracleDrafter:
    """Proposes each run's true continuation; every token is replaced by a wrong one with
    probability ``error_rate`` (seeded). Registered as ``"draft"`` (a drafter name the
    ``speculative`` option knows). Records every proposal and the runs it saw finish."""

    name = "draft"

    def __init__(self, model: FakeModel, error_rate: float = 0.0, seed: int = 0,
                 source: Callable[[Run], Hashable] | None = None) -> None:
        self.model = model
        self.error_rate = error_rate
        self.rng = random.Random(seed)
        self.source = source or (lambda run: run.key)
        self.proposals: list[Proposal] = []
        self.finished_runs: list[Run] = []
        self.closed = False

    def propose(self, jobs: Sequence[DraftJob]) -> None:
        """Fill every unfilled job with its (corrupted) true continuation."""
        for job in jobs:
            if job.tokens:
                continue
            job.bucket, n = ORACLE_BUCKET, job.worth(ORACLE_BUCKET)
            if n <= 0:
                continue
            job.tokens = [self._corrupt(t) for t in true_continuation(self.model, job.run, n)]
            job.source = self.source(job.run)
            self.proposals.append(Proposal(job.run.request_id, job.run.num_generated, n,
                                           tuple(job.tokens)))

    def _corrupt(self, token: int) -> int:
        if self.rng.random() >= self.error_rate:
            return token
        return (token + 1 + self.rng.randrange(self.model.n_vocab - 1)) % self.model.n_vocab

    def finished(self, run: Run) -> None:
        """Remember ``run`` (its ``spec`` holds the request's measurements)."""
        self.finished_runs.append(run)

    def close(self) -> None:
        """Idempotent."""
        self.closed = True


class LeakyDrafter(OracleDrafter):
    """An oracle that says its text came from another tenant: the backend must catch it."""

    def __init__(self, model: FakeModel) -> None:
        super().__init__(model, source=lambda run: CacheKey("elsewhere", "", ()))


class AuditedNgramDrafter(NgramDrafter):
    """The built-in n-gram drafter, checking after each proposal that the draft is a run of
    the request's own tokens or of a text learned under the request's own cache key. A
    failure is recorded (an exception would only fail the tick's requests) and raised by
    :meth:`check_integrity`."""

    def __init__(self, ngram_size: int = 4) -> None:
        super().__init__(ngram_size)
        self.learned: dict[Hashable, list[list[int]]] = {}
        self.proposals: list[Proposal] = []
        self.violations: list[str] = []

    @property
    def num_proposed(self) -> int:
        """Drafts proposed."""
        return len(self.proposals)

    def propose(self, jobs: Sequence[DraftJob]) -> None:
        """Propose, then audit every job it filled."""
        wanting = [job for job in jobs if not job.tokens]
        super().propose(wanting)
        for job in wanting:
            if not job.tokens:
                continue
            run = job.run
            self.proposals.append(Proposal(run.request_id, run.num_generated, job.n_max,
                                           tuple(job.tokens)))
            texts = [run.tokens, *self.learned.get(run.key, [])]
            if len(job.tokens) > job.n_max:
                self.violations.append(f"{len(job.tokens)} draft tokens over {job.n_max}")
            if job.source != run.key:
                self.violations.append(f"draft source {job.source!r} != {run.key!r}")
            if not any(contains(text, job.tokens) for text in texts):
                self.violations.append(f"draft {job.tokens} of {run.key!r} is no text of it")

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if a proposal failed the audit."""
        if self.violations:
            raise AssertionError(f"n-gram drafter: {self.violations[0]}")

    def finished(self, run: Run) -> None:
        """Learn (as the base does) and remember the text under the run's key."""
        if run.serial in self._indexes:
            self.learned.setdefault(run.key, []).append(list(run.tokens))
        super().finished(run)


def contains(text: Sequence[int], part: Sequence[int]) -> bool:
    """Whether ``part`` occurs contiguously in ``text``."""
    n = len(part)
    return any(list(text[i:i + n]) == list(part) for i in range(len(text) - n + 1))


def spec_engine(*, drafter: object | None = None, n_ctx: int = 2048, n_parallel: int = 2,
                unified: bool = True, partial: bool = True, model: FakeModel | None = None,
                cost: CostModel = CPU_COST, backend_cls: type[FakeBackend] = FakeBackend,
                ngram: NgramDrafter | None = None, **config: object
                ) -> tuple[Engine, FakeBackend]:
    """An engine on a fresh fake backend whose clock is the backend's simulated clock;
    ``drafter`` is registered as ``"draft"``, ``ngram`` replaces the built-in n-gram drafter,
    ``config`` goes to :class:`EngineConfig` (e.g. ``spec_type="draft"``). Drafts are verified
    at any number of decoding streams unless ``spec_max_streams`` is given (the tests prove
    verification with many streams at once; the gate has tests of its own)."""
    config.setdefault("spec_max_streams", 0)
    # (the scenarios prefill several requests in one tick, as decode_maximal schedules them)
    config.setdefault("batch_strategy", "decode_maximal")
    backend = backend_cls(n_ctx=n_ctx, n_seq_max=n_parallel, kv_unified=unified,
                          supports_partial_removal=partial, model=model or FakeModel(n_vocab=512),
                          cost=cost, record_plans=True)
    cfg = EngineConfig(n_parallel=n_parallel, kv_unified=unified, **config)  # type: ignore[arg-type]
    drafters: dict[str, object] = {}
    if drafter is not None:
        drafters["draft"] = drafter
    if ngram is not None:
        drafters["ngram"] = ngram
    engine = Engine(backend, cfg, tuning=EngineTuning(ram_min_tokens=4),
                    clock=backend.clock.now, drafters=drafters)  # type: ignore[arg-type]
    return engine, backend


def check_all(engine: Engine, backend: FakeBackend) -> None:
    """Engine and backend integrity, and every slot's KV equal to what the engine believes
    (after a verification: the run's tokens but the last), and audited drafters clean."""
    engine.check_integrity()
    backend.check_integrity()
    for drafter in engine.speculator.drafters.values():
        if isinstance(drafter, AuditedNgramDrafter):
            drafter.check_integrity()
    for slot in engine.pool.slots:
        assert backend.seq_tokens(slot.seq_id) == slot.cached, f"slot {slot.slot_id} KV drifted"


def checked_drain(engine: Engine, backend: FakeBackend) -> int:
    """Tick to idle, checking :func:`check_all` after every tick."""
    return drain(engine, each=lambda: check_all(engine, backend))


@dataclass(slots=True)
class Job:
    """A request to run: prompt, options and (after running) its recorder."""

    request_id: Hashable
    prompt: list[int]
    options: RequestOptions
    identity: str = ""
    sink: Recorder = field(default_factory=Recorder)


def job(request_id: Hashable, prompt: Sequence[int], *, max_tokens: int = 24,
        scope: str | None = None, adapters: tuple = (), stop: tuple[str, ...] = (),
        speculative: object = None, identity: str = "", **sampling: object) -> Job:
    """A :class:`Job` from flat options (``sampling`` goes to :class:`SamplingParams`)."""
    sampling.setdefault("seed", 1)
    options = RequestOptions(max_tokens=max_tokens, cache_scope=scope, adapters=adapters,
                             stop=stop, speculative=speculative,
                             sampling=SamplingParams(**sampling))  # type: ignore[arg-type]
    return Job(request_id, list(prompt), options, identity)


def submit_jobs(engine: Engine, jobs: Sequence[Job]) -> None:
    """Submit every job with a fresh recorder."""
    for j in jobs:
        j.sink = Recorder()
        engine.submit(Request(j.request_id, j.prompt, j.options, j.sink, j.identity))


def run_jobs(engine: Engine, backend: FakeBackend, jobs: Sequence[Job]) -> list[Recorder]:
    """Submit every job, tick to idle with :func:`check_all` after each tick; the recorders."""
    submit_jobs(engine, jobs)
    checked_drain(engine, backend)
    return [j.sink for j in jobs]


def reference_of(backend: FakeBackend, j: Job) -> list[int]:
    """The oracle's output for ``j``."""
    o = j.options
    return backend.model.reference(j.prompt, o.max_tokens, o.sampling, o.adapters)


def transcript(sink: Recorder) -> list[object]:
    """Everything a consumer sees, timings aside: each token event and the final event's
    reason, token count and stop word."""
    out: list[object] = [(e.token_id, e.text, e.logprobs) for e in sink.events
                         if isinstance(e, TokenEvent)]
    final = sink.final
    assert isinstance(final, DoneEvent), f"unexpected final event {final!r}"
    out.append((str(final.finish_reason), final.completion_tokens, final.stop_word))
    return out


# --- the speculation tests' shared models, prompts and checks -------------------------------

MODEL = FakeModel(n_vocab=512)
ENDLESS = FakeModel(n_vocab=512, eog_permille=0)  # never draws EOG: outputs reach max_tokens
SMALL = FakeModel(n_vocab=8)  # generated tokens often repeat the prompt's n-grams
PROMPTS = ([*range(1, 13)], [7, 8, 9] * 4 + [3], [300, 301, 302, 5, 6])
SMALL_PROMPTS = ([1, 2, 3, 4] * 4, [5, 6, 7, 5, 6, 7, 5, 6], [2, 3] * 6 + [4])


def draft_lens(plans: list[BatchPlan]) -> list[int]:
    """Draft length of every segment that asked for output rows."""
    return [seg.n_outputs - 1 for plan in plans for seg in plan.segments if seg.logits]


def mixed_jobs(prompts, max_tokens: int = 30, **options) -> list[Job]:
    """Each prompt greedy and sampled (temp 0.8, its own seed)."""
    return [job(f"{i}-{temp}", p, max_tokens=max_tokens, temp=temp, seed=10 + i, **options)
            for i, p in enumerate(prompts) for temp in (0.0, 0.8)]


def assert_reference(backend: FakeBackend, jobs: list[Job]) -> None:
    for j in jobs:
        assert j.sink.tokens == reference_of(backend, j), f"{j.request_id}: not the reference"
