"""Drafters: cheap proposals of the tokens a request will generate next.

A :class:`Drafter` fills :class:`DraftJob` s (one per decoding slot that speculates this tick)
with proposed token ids; the engine verifies them in the tick's batch (see
:mod:`.speculator`). Proposals never change what is generated, only how fast.

- :class:`NgramDrafter` (``"ngram"``): prompt lookup. The longest n-gram ending the request's
  tokens (prompt + generated, ``ngram_size`` down to 2) is looked up in those same tokens; the
  tokens that followed its latest earlier occurrence are the draft. When the request's own text
  has no match, a pool learned from finished requests is asked, one pool per cache key
  (``cache_scope``, model identity, adapter set): one tenant's text is never proposed to
  another, as KV is never reused across scopes.
- :class:`~.model_drafter.ModelDrafter` (``"draft"``): a smaller model on a
  backend of its own.

Each job records ``source``, the cache key of the text its draft came from; the engine passes
it to the backend as the segment's ``draft_tag`` (the fake backend proves it always equals the
request's own key).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from llamapy.engine.request import Run
    from llamapy.engine.slots import Slot

__all__ = ["DraftJob", "Drafter", "NgramDrafter", "NgramIndex", "NgramPool"]

#: The n-gram the shared pool is keyed by.
POOL_NGRAM = 3
#: Longest match a proposal's bucket tells apart (longer matches share the last bucket).
MATCH_BUCKETS = (2, 3, 4, 8, 12)


def match_bucket(matched: int) -> int:
    """The bucket of a match of ``matched`` tokens: the largest of :data:`MATCH_BUCKETS`
    not above it."""
    return max((b for b in MATCH_BUCKETS if b <= matched), default=MATCH_BUCKETS[0])


@dataclass(slots=True, eq=False)
class DraftJob:
    """One slot asking for a draft of at most ``n_max`` tokens; a drafter fills ``tokens``
    (empty: nothing to propose), ``source`` and ``bucket`` (the kind of proposal, e.g.
    ``("ngram", 4)`` for a 4-token match: acceptance is learned per bucket). ``length`` tells
    a drafter how many tokens of a proposal of a bucket are worth verifying (0: none); a drafter
    asks it once per proposal, before it spends work on the draft when it can."""

    slot: Slot
    run: Run
    n_max: int
    tokens: list[int] = field(default_factory=list)
    source: Hashable = None
    bucket: Hashable = None
    length: Callable[[Hashable], int] | None = None

    def worth(self, bucket: Hashable) -> int:
        """How many draft tokens of ``bucket`` to propose (``n_max`` without a policy)."""
        return self.n_max if self.length is None else min(self.n_max, self.length(bucket))


class Drafter(Protocol):
    """Proposes draft tokens for a tick's speculating slots (on the engine's thread)."""

    name: str

    def propose(self, jobs: Sequence[DraftJob]) -> None:
        """Fill ``tokens`` of the jobs it can draft for (jobs already filled are skipped)."""
        ...

    def finished(self, run: Run) -> None:
        """``run`` ended (its tokens may be learned; per-run state freed)."""
        ...

    def close(self) -> None:
        """Free what the drafter holds; idempotent."""
        ...


class NgramIndex:
    """The latest earlier occurrence of every n-gram (``sizes``) of one growing token list,
    indexed incrementally: each call only adds the tokens appended since the last."""

    __slots__ = ("_done", "_maps", "_sizes")

    def __init__(self, max_n: int, min_n: int = 2) -> None:
        self._sizes = tuple(range(max_n, min_n - 1, -1))
        self._maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self._sizes}
        self._done = 0

    def lookup(self, tokens: Sequence[int], n_max: int) -> list[int]:
        """Up to ``n_max`` tokens that followed the latest earlier occurrence of the longest
        n-gram ending ``tokens`` ([] when none occurred)."""
        return self.match(tokens, n_max)[1]

    def match(self, tokens: Sequence[int], n_max: int) -> tuple[int, list[int]]:
        """:meth:`lookup`, with how many tokens before the continuation match those ending
        ``tokens`` (the n-gram, extended backwards up to the last bucket)."""
        end = len(tokens)
        for e in range(max(self._done, 1), end):  # n-grams ending at e, continued by tokens[e]
            for n, seen in self._maps.items():
                if e >= n:
                    seen[tuple(tokens[e - n:e])] = e
        self._done = max(self._done, end)
        for n in self._sizes:
            if end >= n:
                at = self._maps[n].get(tuple(tokens[end - n:end]))
                if at is not None:
                    return _extend_back(tokens, at, n), list(tokens[at:at + n_max])
        return 0, []


def _extend_back(tokens: Sequence[int], at: int, n: int) -> int:
    """The match length of an ``n``-token match ending at ``at`` against the end of
    ``tokens``, extended backwards (at most to the last bucket)."""
    end, m = len(tokens), n
    while m < MATCH_BUCKETS[-1] and at - m - 1 >= 0 and tokens[at - m - 1] == tokens[end - m - 1]:
        m += 1
    return m


class NgramPool:
    """Continuations learned from finished requests, one bounded LRU table per cache key."""

    def __init__(self, max_keys: int = 64, max_entries: int = 1 << 15, span: int = 16) -> None:
        self.max_keys = max_keys
        self.max_entries = max_entries
        self.span = span
        self._tables: OrderedDict[Hashable, OrderedDict[tuple[int, ...], tuple[int, ...]]] = \
            OrderedDict()

    def learn(self, key: Hashable, tokens: Sequence[int]) -> None:
        """Remember what followed each n-gram of ``tokens`` under ``key``."""
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = OrderedDict()
            while len(self._tables) > self.max_keys:
                self._tables.popitem(last=False)
        self._tables.move_to_end(key)
        n = POOL_NGRAM
        for e in range(n, len(tokens)):
            gram = tuple(tokens[e - n:e])
            table[gram] = tuple(tokens[e:e + self.span])
            table.move_to_end(gram)
        while len(table) > self.max_entries:
            table.popitem(last=False)

    def lookup(self, key: Hashable, tokens: Sequence[int], n_max: int) -> list[int]:
        """What followed the n-gram ending ``tokens`` in text learned under ``key`` only."""
        table = self._tables.get(key)
        if table is None or len(tokens) < POOL_NGRAM:
            return []
        cont = table.get(tuple(tokens[-POOL_NGRAM:]))
        return list(cont[:n_max]) if cont else []

    def keys(self) -> list[Hashable]:
        """The cache keys with a table."""
        return list(self._tables)


class NgramDrafter:
    """Prompt lookup over each request's tokens, then the scoped pool (see the module)."""

    name = "ngram"

    def __init__(self, ngram_size: int = 4, pool: NgramPool | None = None) -> None:
        self.ngram_size = ngram_size
        self.pool = pool if pool is not None else NgramPool()
        self._indexes: dict[int, NgramIndex] = {}  # by run serial

    def propose(self, jobs: Sequence[DraftJob]) -> None:
        """Fill each unfilled job from its own tokens, else from its key's pool."""
        for job in jobs:
            if job.tokens:
                continue
            run = job.run
            index = self._indexes.get(run.serial)
            if index is None:  # the request's own ngram_size (speculative option) wins
                size = run.spec.params.ngram_size if run.spec is not None else self.ngram_size
                index = self._indexes[run.serial] = NgramIndex(size)
            matched, tokens = index.match(run.tokens, job.n_max)
            bucket: Hashable = ("ngram", match_bucket(matched))
            if not tokens:
                tokens, bucket = self.pool.lookup(run.key, run.tokens, job.n_max), ("pool",)
            if tokens:
                job.bucket = bucket  # an opportunity, even if not worth verifying now
                tokens = tokens[:job.worth(bucket)]
            if tokens:
                job.tokens, job.source = tokens, run.key

    def finished(self, run: Run) -> None:
        """Learn the run's tokens into its key's pool (if it drafted with us)."""
        if self._indexes.pop(run.serial, None) is not None:
            self.pool.learn(run.key, run.tokens)

    def close(self) -> None:
        """Forget per-run indexes (the pool stays)."""
        self._indexes.clear()
