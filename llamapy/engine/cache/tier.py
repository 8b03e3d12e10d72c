"""The contract of a cache tier: a level below the slots that keeps serialised prefixes.

The engine's tiers are the RAM cache (:class:`~llamapy.engine.cache.ram.PromptCache`) and the
disk cache (:class:`~llamapy.engine.cache.disk.DiskPromptCache`). The resolver
(:class:`~llamapy.engine.cache.resolver.PrefixResolver`) holds them in an ordered list, the
cheapest to restore from first, and treats them alike:

- **finding**: :meth:`~CacheTier.lookup` names the entry with the longest usable prefix of a
  prompt under one cache key. A tier wins only when it offers strictly more tokens than every
  cheaper source (the slot itself, a donor slot, an earlier tier).
- **reading**: :meth:`~CacheTier.fetch` hands over the entry's state; a tier that reads off the
  tick thread answers ``PENDING`` until the bytes are there, and the run waits unresolved (the
  tick calls :meth:`~CacheTier.wait` when nothing else can run, and :meth:`~CacheTier.forget`
  when a run no longer needs its read). ``FAILED`` (vanished, corrupt, too slow) makes the run
  choose again without that tier.
- **keeping**: :meth:`~CacheTier.offer` takes a prefix about to leave the slots (serialised
  only once it will be stored); the resolver offers it down the list until a tier takes it or
  already :meth:`~CacheTier.covers` it. What a tier evicts is its own business (the RAM tier
  hands its evictions to the disk tier).

Every tier keys its entries by the request's cache key
(:class:`~llamapy.engine.request.CacheKey`): an entry is never found under another key, so no
tier lets KV cross a ``cache_scope``, tenant or adapter set.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from llamapy.engine.request import CacheKey

__all__ = ["CacheTier", "ReadStatus"]


class ReadStatus(enum.Enum):
    """Where a run's read of a tier entry stands."""

    PENDING = "pending"
    READY = "ready"
    FAILED = "failed"


class CacheTier(Protocol):
    """A level of serialised prefixes below the slots (see the module docstring)."""

    #: The tier's name: the reuse source it reports (``timings.reuse_source``) and the key of
    #: its counters (``"ram"``, ``"disk"``).
    name: str
    #: Shortest prefix the tier keeps, in tokens.
    min_tokens: int

    @property
    def enabled(self) -> bool:
        """False when the tier keeps nothing (no budget, no folder)."""
        ...

    def lookup(self, key: CacheKey | None, prompt: Sequence[int], cap: int, *,
               exact: bool = False) -> tuple[Any | None, int]:
        """The entry with the longest usable prefix of ``prompt`` (at most ``cap`` tokens)
        under ``key``, and that length; ``(None, 0)`` if none is worth restoring. ``exact``:
        only entries usable whole (a backend that cannot trim a restored tail)."""
        ...

    def fetch(self, serial: int, entry: Any) -> tuple[ReadStatus, bytes | None]:
        """The state of ``entry`` for run ``serial``: ``(READY, state)``, ``(PENDING, None)``
        (ask again on a later tick) or ``(FAILED, None)``."""
        ...

    def forget(self, serial: int) -> None:
        """Drop run ``serial``'s pending read, if any."""
        ...

    def wait(self, timeout: float = 0.05) -> None:
        """Block up to ``timeout`` seconds until a pending read completes (at once if none)."""
        ...

    def token_ids(self, entry: Any) -> tuple[int, ...]:
        """The tokens ``entry`` holds."""
        ...

    def checkpoint_positions(self, entry: Any) -> Sequence[int] | None:
        """The positions of the context checkpoints ``entry`` carries (see
        :mod:`llamapy.engine.cache.rewind`), or None when they are known only once it is
        read."""
        ...

    def touch(self, entry: Any) -> None:
        """Mark ``entry`` most recently used."""
        ...

    def offer(self, key: CacheKey | None, token_ids: Sequence[int], get_size: Callable[[], int],
              get_data: Callable[[], bytes]) -> bool:
        """Keep a prefix about to leave the slots: ``get_size`` is called only for a prefix the
        tier would keep, ``get_data`` only when it will be stored. Whether it was taken."""
        ...

    def covers(self, key: CacheKey | None, token_ids: Sequence[int]) -> bool:
        """Whether an entry under ``key`` already holds ``token_ids`` (or a longer prefix
        starting with them)."""
        ...
