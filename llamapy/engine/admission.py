"""Admission: the submission checks (everything that must fail before a request changes any
engine state), and the order in which queued runs are offered a slot (:class:`Admission`;
across tenants, see :mod:`llamapy.engine.tenants`)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Container, Hashable, Iterator

from llamapy.engine.backend import Backend
from llamapy.engine.cache.ram import common_prefix
from llamapy.engine.cache.resolver import PrefixResolver
from llamapy.engine.media import check_media
from llamapy.engine.options import EngineConfig, RequestOptions
from llamapy.engine.planner import queued_view
from llamapy.engine.request import Request, Run
from llamapy.engine.slots import Slot, SlotPool
from llamapy.engine.tenants import Tenants, tenant_of
from llamapy.errors import ContextOverflowError, InvalidOptionError, UnsupportedFeatureError
from llamapy.options.limits import check_limits, check_model_bounds

__all__ = ["Admission", "batch_limit", "check_backend", "check_request", "pooled_limit"]


def check_backend(backend: Backend, config: EngineConfig) -> None:
    """``InvalidOptionError`` unless ``config`` fits the backend (slots, KV layout; a
    backend that pools needs a unified KV cache)."""
    if config.n_parallel > backend.n_seq_max:
        raise InvalidOptionError(f"n_parallel={config.n_parallel} exceeds the backend's "
                                 f"n_seq_max={backend.n_seq_max}", option="n_parallel")
    if backend.pools and not backend.kv_unified:  # (llama.cpp would split a sequence)
        raise InvalidOptionError("a context that pools needs kv_unified: with a KV cache "
                                 "per sequence llama.cpp splits a batch across physical "
                                 "batches, and a pooled sequence must stay in one",
                                 option="kv_unified")
    if config.kv_unified != backend.kv_unified:
        raise InvalidOptionError(f"kv_unified={config.kv_unified} but the backend was created "
                                 f"with kv_unified={backend.kv_unified}", option="kv_unified")


def check_request(request: Request, backend: Backend, pool: SlotPool,
                  active: Container[Hashable], config: EngineConfig) -> list[int]:
    """Validate ``request``; return its prompt as a list of Python ints.

    Raises ``InvalidOptionError`` (bad options type, duplicate active id, token ids that are not
    integers in ``[0, n_vocab)``, an empty prompt for a request that samples, options over the
    serving limits of ``config``, a biased token outside the vocabulary),
    ``UnknownLeaseError`` and ``ContextOverflowError`` (stage ``"admit"``: prompt plus
    ``max_tokens`` exceeds the per-sequence context; stage ``"pool"``: a pooled prompt
    longer than one batch). A pooled request (:attr:`Request.pooled`) needs a backend that pools
    and a backend that pools takes only pooled requests (``UnsupportedFeatureError``).
    """
    if not isinstance(request.options, RequestOptions):
        raise InvalidOptionError("request.options must be RequestOptions", option="options")
    check_limits(request.options, config)
    check_model_bounds(request.options.sampling, backend.n_vocab)
    try:
        hash(request.request_id)
    except TypeError:
        raise InvalidOptionError("request id must be hashable", option="request_id") from None
    if request.request_id in active:
        raise InvalidOptionError(f"request id {request.request_id!r} is already active",
                                 option="request_id")
    prompt = _tokens(request, backend, request.options.max_tokens > 0,
                     min(config.n_batch, backend.n_batch, backend.n_ubatch), pool)
    if not prompt and (request.options.max_tokens > 0 or request.pooled):
        raise InvalidOptionError("empty prompt", option="token_ids")
    _check_pooled(request, prompt, backend, config)
    _check_fits(request, prompt, backend, pool)
    return prompt


def _check_pooled(request: Request, prompt: list[int], backend: Backend,
                  config: EngineConfig) -> None:
    """A pooled request only on a backend that pools, and only such requests there; one
    decode must hold its whole prompt."""
    if request.pooled is not True and request.pooled is not False:
        raise InvalidOptionError("request.pooled must be a bool", option="pooled")
    if request.pooled != backend.pools:
        raise UnsupportedFeatureError("pooled", "this model pools its input into one output "
                                      "(a reranker): it generates nothing" if backend.pools
                                      else "this model's context does not pool its input")
    if not request.pooled:
        return
    if request.options.max_tokens != 0 or request.lease_id is not None or request.media:
        raise InvalidOptionError("a pooled request samples nothing (max_tokens 0), on no "
                                 "lease, without media", option="pooled")
    limit = pooled_limit(backend, config)
    if len(prompt) > limit:
        raise ContextOverflowError(stage="pool", resident_tokens=0,
                                   additional_tokens=len(prompt), n_ctx=limit)


def batch_limit(backend: Backend, config: EngineConfig) -> int:
    """The most tokens one decode takes: ``n_batch``, and one physical batch for a backend
    that pools (see its contract)."""
    n_batch = min(config.n_batch, backend.n_batch)
    return min(n_batch, backend.n_ubatch) if backend.pools else n_batch


def pooled_limit(backend: Backend, config: EngineConfig) -> int:
    """The longest pooled prompt (on a backend that pools): one decode, within the
    per-sequence context."""
    return min(batch_limit(backend, config), backend.n_ctx_seq)


def _tokens(request: Request, backend: Backend, samples: bool, n_batch: int,
            pool: SlotPool) -> list[int]:
    n_vocab = backend.n_vocab
    try:
        prompt = list(map(operator.index, request.token_ids))
    except TypeError as exc:
        raise InvalidOptionError("token ids must be integers", option="token_ids") from exc
    if not isinstance(request.media, tuple):
        raise InvalidOptionError("request.media must be a tuple of MediaSpan", option="media")
    if request.media or (prompt and min(prompt) < 0 and request.lease_id is not None):
        check_media(prompt, request.media, n_vocab, samples, n_batch,
                    _held(request, prompt, pool), backend.media_width)
    elif prompt and (min(prompt) < 0 or max(prompt) >= n_vocab):
        raise InvalidOptionError(f"token ids must be in [0, {n_vocab})", option="token_ids")
    return prompt


def _held(request: Request, prompt: list[int], pool: SlotPool) -> int:
    """Prompt tokens a request's leased slot already holds under its key (0 without a
    lease): media ids among them need no media span."""
    if request.lease_id is None:
        return 0
    slot = pool.leased_slot(request.lease_id)
    return common_prefix(slot.cached, prompt) if slot.key == request.cache_key else 0


def _check_fits(request: Request, prompt: list[int], backend: Backend, pool: SlotPool) -> None:
    total = len(prompt) + request.options.max_tokens
    resident = 0
    if request.lease_id is not None:
        slot = pool.leased_slot(request.lease_id)
        if slot.key == request.cache_key:
            resident = common_prefix(slot.cached, prompt)
    if total > backend.n_ctx_seq:
        raise ContextOverflowError(stage="admit", resident_tokens=resident,
                                   additional_tokens=total - resident, n_ctx=backend.n_ctx_seq)


def effective_cache_prompt(request: Request, default: bool) -> bool:
    """A request's ``cache_prompt`` (``default``: the server's): leased slots always reuse
    and retain, pooled requests never (their prompt is decoded whole, and pooled KV serves
    nothing after it)."""
    if request.lease_id is not None:
        return True
    if request.pooled:
        return False
    value = request.options.cache_prompt
    return default if value is None else value


class Admission:
    """The order queued runs are offered slots: within a tenant, lease-bound, pinned
    (``slot_id``) and affine (``session``) runs first, the rest in the strategy's
    ``admission_order`` (if it has one); across tenants, round robin (:class:`Tenants`).
    A run whose routing raises is handed to ``fail`` alone; a strategy's ``admission_order``
    that raises fails the runs it was ordering (via the tick)."""

    def __init__(self, pool: SlotPool, prefix: PrefixResolver, strategy: object,
                 clock: Callable[[], float], tenants: Tenants | None = None) -> None:
        self.pool = pool
        self.prefix = prefix
        self.strategy = strategy
        self.clock = clock
        self.tenants = tenants or Tenants()

    def could_start(self, run: Run) -> bool:
        """Whether ``run`` can take a slot now (True when routing it raises: the tick's
        admission then fails it)."""
        try:
            return not self.capped(run) and self.pool.route(run) is not None
        except Exception:
            return True

    def placement(self, probe: Run, queue: list[Run]) -> Slot | None:
        """The slot a new request (``probe``) takes at submission, None to queue it: never
        past a queued run of the same lease (or none), nor past its tenant's slot cap; its
        ``slot_id`` naming another tenant's slot is refused now, queued or not."""
        lease_id = probe.request.lease_id
        self.pool.pinned_slot(probe)  # (PermissionDeniedError)
        if any(r.request.lease_id == lease_id for r in queue) or self.capped(probe):
            return None
        return self.pool.route(probe)

    def capped(self, run: Run) -> bool:
        """Whether ``run``'s tenant already holds ``tenant_max_slots`` slots (leased slots and
        runs on a lease aside), so ``run`` waits although a slot may be idle."""
        cap = self.tenants.max_slots
        if cap <= 0 or run.request.lease_id is not None:
            return False
        tenant, held = tenant_of(run), 0
        for slot in self.pool.slots:
            if slot.run is not None and slot.lease_id is None and tenant_of(slot.run) == tenant:
                held += 1
        return held >= cap

    def order(self, queue: list[Run], fail: Callable[[list[Run], str, Exception], None]
              ) -> Iterator[Run]:
        """The runs of ``queue`` in the order they are offered a slot: the caller places each
        before it takes the next (the tenants' turns follow the placements)."""
        first: list[Run] = []
        rest: list[Run] = []
        for run in list(queue):
            try:
                (first if self._goes_first(run) else rest).append(run)
            except Exception as exc:  # this run cannot be routed: it alone ends
                fail([run], "admission", exc)
        return self.tenants.interleave(first + self._strategy_order(rest))

    def _goes_first(self, run: Run) -> bool:
        return (run.request.lease_id is not None or self.pool.pinned_slot(run) is not None
                or self.pool.affine_slot_free(run))

    def _strategy_order(self, runs: list[Run]) -> list[Run]:
        order_fn = getattr(self.strategy, "admission_order", None)
        idle = self.pool.idle()
        if order_fn is None or len(runs) < 2 or not idle:
            return runs
        views = tuple(queued_view(r, self.prefix.warm_tokens(r, idle)) for r in runs)
        order = list(order_fn(views, self.clock()))
        if sorted(order) != list(range(len(runs))):
            raise InvalidOptionError("batch_strategy.admission_order must return a permutation "
                                     "of queue indices", option="batch_strategy")
        return [runs[i] for i in order]
