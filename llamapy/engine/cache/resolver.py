"""Prefix reuse: which KV a run starts from, and what happens to KV that is dropped.

Sources for a newly admitted run, longest match wins, ties to the cheaper (own < donor < each
cache tier in order):

- **own**: the longest common prefix of the slot's cached tokens and the prompt;
- **donor**: another slot's computed tokens, adopted by a metadata-only ``seq_cp`` where the
  KV is unified and can be trimmed (an active slot counts with the tokens it has already
  computed); on a backend without partial removal, a copy of the donor's whole state and
  checkpoints rewound to its newest checkpoint within the shared prefix (:meth:`Rewinder.copy
  <llamapy.engine.cache.rewind.Rewinder.copy>`);
- **a cache tier** (:class:`~llamapy.engine.cache.tier.CacheTier`; the RAM tier
  :class:`~llamapy.engine.cache.ram.PromptCache`, then the disk tier
  :class:`~llamapy.engine.cache.disk.DiskPromptCache`): its entry's state, fetched (the disk
  tier reads and verifies it off the tick thread; the run waits unresolved meanwhile),
  restored with ``state_seq_set`` and trimmed to the match. A fetch that fails (file vanished,
  corrupt, too slow) is counted under the tier and the run chooses again without it; a restore
  the backend refuses clears the sequence and the run prefills from scratch.

Dropped KV goes down a level: a prefix about to lose at least ``min_tokens`` of its tail (a
conversation whose slot another conversation with the same system prompt takes over) is
offered to the RAM cache, RAM
evictions (and prefixes too large for RAM) go to the disk cache, and with the RAM cache off a
discarded prefix goes to disk directly. At close, :meth:`PrefixResolver.persist` writes what
the slots and the RAM cache hold to disk, so a restarted server finds it.

Prefixes a request asks to keep (``cache_pins``) are pinned in the RAM cache as its slot comes
to hold them (:mod:`llamapy.engine.cache.pinning`).

Only the same key ``(cache_scope, cache_identity, adapter_set)`` may reuse, on every path above
and in in-flight dedup (so KV computed under one adapter set is never read under another);
reuse is capped at prompt length - 1 (prompt length for prefill-only runs);
``cache_prompt=False`` neither reuses nor retains; backends without partial removal reuse a
prefix that ends inside a cached sequence only back to its newest context checkpoint before
the divergence (:mod:`llamapy.engine.cache.rewind`; checkpoints travel with the prefix into the
tiers and to donor copies).

**In-flight dedup** (:meth:`PrefixResolver.follow`, every tick, for prefilling runs): adopt
whatever another slot has computed of our prompt since we last looked, and wait (skip this tick)
while a slot admitted before us is still computing a shared part of at least
``follow_min_tokens``: a wave of requests with one long shared prefix computes it once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from llamapy.engine.backend import Backend
from llamapy.engine.cache.disk import DiskPromptCache
from llamapy.engine.cache.inflight import best_donor, follow
from llamapy.engine.cache.pinning import plan_pins, reuse_for_pins, write_pins
from llamapy.engine.cache.ram import PromptCache, common_prefix
from llamapy.engine.cache.rewind import Rewinder
from llamapy.engine.cache.tier import CacheTier, ReadStatus
from llamapy.engine.media import media_floor
from llamapy.engine.options import EngineConfig, EngineTuning
from llamapy.engine.request import Run
from llamapy.engine.slots import Slot, SlotPool
from llamapy.engine.stats import Counters, InstabilityEvent

__all__ = ["PrefixResolver"]

class _Choice(NamedTuple):
    source: str  # "own", "donor" or a tier's name
    n: int
    cost: int  # 0 own, 1 donor, 2.. the tiers in order
    donor: Slot | None = None
    tier: CacheTier | None = None
    entry: object = None


class PrefixResolver:
    """Applies reuse decisions to the backend and keeps ``slot.cached`` exact. ``tiers`` are
    the cache tiers below the slots, cheapest first; ``ram`` (the RAM tier) also parks idle
    slots and keeps pins, and the last tier takes what the slots and RAM hold at close."""

    def __init__(self, backend: Backend, pool: SlotPool, ram: PromptCache, counters: Counters,
                 tuning: EngineTuning, on_instability: Callable[[InstabilityEvent], None],
                 disk: DiskPromptCache, config: EngineConfig) -> None:
        self.backend = backend
        self.cache_idle_slots = config.cache_idle_slots
        self.pool = pool
        self.ram = ram
        self.disk = disk
        self.tiers: tuple[CacheTier, ...] = (ram, disk)
        self.counters = counters
        self.tuning = tuning
        self.on_instability = on_instability
        self.can_share = backend.kv_unified and backend.supports_partial_removal
        self.rewinder = Rewinder(backend, counters, max_count=config.ctx_checkpoints,
                                 max_bytes=int(config.ctx_checkpoints_mb * 1024 * 1024),
                                 step=config.checkpoint_min_step)
        self.exact = not (backend.supports_partial_removal or self.rewinder.active)
        ram.resume_points = disk.resume_points = not backend.supports_partial_removal

    # --- admission -----------------------------------------------------------------------------

    def resolve(self, run: Run) -> bool:
        """Pick and apply the reuse source for a run just placed on ``run.slot``. False, with
        nothing applied (the run stays ``RESOLVING``), while the best source is a tier entry
        still being read: call again on a later tick."""
        slot = run.slot
        assert slot is not None, "resolve: run has no slot"
        if not run.cache_prompt:
            run.machine.fire("resolve")
            self.discard(slot, 0)
            slot.key = run.key
            return True
        skip: list[CacheTier] = []
        choice, data = self._choose(run, slot, skip), None
        while choice.tier is not None:
            status, data = choice.tier.fetch(run.serial, choice.entry)
            if status is ReadStatus.PENDING:
                return False
            if status is ReadStatus.READY:
                break
            self.counters.restore_failures[choice.tier.name] += 1
            skip.append(choice.tier)
            choice = self._choose(run, slot, skip)
        self.forget(run.serial)
        run.machine.fire("resolve")
        self._note_instability(run, slot)
        run.pins = plan_pins(run, self.ram)
        n = media_floor(run.request.media, reuse_for_pins(run, self.ram, choice.n))
        self._apply(run, slot, choice._replace(n=n), data)
        self.rewinder.plan(run, len(slot.cached))
        self.write_pins(run)
        return True

    def forget(self, serial: int) -> None:
        """Drop run ``serial``'s pending tier reads (it is resolved, or it ended)."""
        for tier in self.tiers:
            tier.forget(serial)

    def wait(self, timeout: float = 0.05) -> None:
        """Nothing to decode: block up to ``timeout`` seconds on a pending tier read."""
        for tier in self.tiers:
            tier.wait(timeout)

    def write_pins(self, run: Run) -> None:
        """Pin the prefixes of ``run``'s ``cache_pins`` its slot now holds
        (:mod:`llamapy.engine.cache.pinning`)."""
        if run.pins and run.slot is not None:
            write_pins(run, run.slot, self.ram, self.disk, self.backend)

    def _apply(self, run: Run, slot: Slot, choice: _Choice, data: bytes | None) -> None:
        n, shared = choice.n, self._shared(run, slot, choice)
        rewinds = self.counters.num_checkpoint_restores
        if choice.source == "own":
            self.discard(slot, n)
            n = len(slot.cached)
        else:
            self.discard(slot, 0)
            if choice.donor is not None and self.can_share:
                self.backend.seq_cp(choice.donor.seq_id, slot.seq_id, 0, n)
                slot.cached = run.prompt[:n]
            elif choice.donor is not None:
                n = self._copy(choice.donor, slot, n)
            elif choice.tier is not None and data is not None:
                n = self._restore(slot, choice.tier, choice.entry, data, n)
        slot.key = run.key
        self._record(run, choice.source if n else None, n)
        if n and self.counters.num_checkpoint_restores > rewinds:
            run.timings.checkpoint_tokens, run.timings.checkpoint_behind = n, shared - n
            self.counters.num_checkpoint_tokens_behind += shared - n

    @staticmethod
    def _shared(run: Run, slot: Slot, choice: _Choice) -> int:
        """Tokens the source shares with the prompt (before any checkpoint floor)."""
        tokens = (choice.tier.token_ids(choice.entry) if choice.tier is not None
                  else slot.cached if choice.donor is None else choice.donor.cached)
        return min(common_prefix(tokens, run.prompt), run.reuse_cap)

    def _choose(self, run: Run, slot: Slot, skip: Sequence[CacheTier] = ()) -> _Choice:
        """The longest source of ``run``'s prompt, the cheapest of equals (so a tier wins only
        with strictly more tokens than every cheaper source)."""
        donor, n_donor = (self._best_donor(run, slot) if self.can_share or self.rewinder.active
                          else (None, 0))
        options = [_Choice("own", self._own(run, slot), 0),
                   _Choice("donor", n_donor, 1, donor=donor)]
        for cost, tier in enumerate(self.tiers, start=2):
            if tier.enabled and tier not in skip:
                entry, n = tier.lookup(run.key, run.prompt, run.reuse_cap, exact=self.exact)
                if entry is not None and self.rewinder.active:
                    n = self.rewinder.reach_entry(tier.checkpoint_positions(entry),
                                                  len(tier.token_ids(entry)), n)
                options.append(_Choice(tier.name, n, cost, tier=tier, entry=entry))
        return max(options, key=lambda o: (o.n, -o.cost))

    def _own(self, run: Run, slot: Slot) -> int:
        if slot.key != run.key:
            return 0
        n = min(common_prefix(slot.cached, run.prompt), run.reuse_cap)
        if n < len(slot.cached) and not self.backend.supports_partial_removal:
            return self.rewinder.reach(slot.cached, slot.checkpoints, n)
        return n


    def _best_donor(self, run: Run, slot: Slot, floor: int = 0) -> tuple[Slot | None, int]:
        return best_donor(self.pool, run, slot, floor,
                          None if self.can_share else self.rewinder)

    def _copy(self, donor: Slot, slot: Slot, n: int) -> int:
        if not self.rewinder.copy(donor, slot):
            return 0
        self.trim(slot, n)
        return len(slot.cached)

    def _restore(self, slot: Slot, tier: CacheTier, entry: object, data: bytes, n: int) -> int:
        if not self.load(slot, data, tier.token_ids(entry)):
            self.counters.restore_failures[tier.name] += 1
            return 0
        tier.touch(entry)
        self.counters.restores[tier.name] += 1
        self.trim(slot, n)
        return len(slot.cached)

    def load(self, slot: Slot, data: bytes, token_ids: Sequence[int]) -> bool:
        """Replace ``slot``'s KV with serialised state holding ``token_ids`` (with its
        checkpoints, :mod:`~llamapy.engine.cache.rewind`). False (the slot then empty) when
        the backend refuses it or it holds another number of positions."""
        state, checkpoints = self.rewinder.unpack(data, token_ids)
        ok = self.backend.state_seq_set(slot.seq_id, state)
        slot.checkpoints = checkpoints if ok else type(checkpoints)()
        if not ok or self.backend.seq_pos_max(slot.seq_id) != len(token_ids) - 1:
            self.backend.seq_rm(slot.seq_id, 0, -1)
            slot.cached = []
            slot.checkpoints.clear()
            return False
        slot.cached = list(token_ids)
        return True

    def _record(self, run: Run, source: str | None, n: int) -> None:
        run.timings.reused_tokens = n
        run.timings.reuse_source = source
        if source is not None:
            self.counters.reused[source] += n

    def _note_instability(self, run: Run, slot: Slot) -> None:
        history = len(slot.cached)
        if slot.key != run.key or history < self.tuning.instability_min_history:
            return
        matched = common_prefix(slot.cached, run.prompt)
        if 0.1 * history <= matched < 0.5 * history:
            self.counters.num_instability_events += 1
            self.on_instability(InstabilityEvent(run.request_id, slot.slot_id, history,
                                                 matched, len(run.prompt)))

    def warm_tokens(self, run: Run, idle: list[Slot]) -> int:
        """Prompt tokens ``run`` could reuse if admitted now: the best idle slot's cache under
        its key, or a RAM or disk cache entry (0 for ``cache_prompt=False``)."""
        if not run.cache_prompt:
            return 0
        best = 0
        for slot in idle:
            if slot.key == run.key and len(slot.cached) > best:
                best = max(best, min(common_prefix(slot.cached, run.prompt), run.reuse_cap))
        for tier in self.tiers:
            if tier.enabled:
                best = max(best, tier.lookup(run.key, run.prompt, run.reuse_cap,
                                             exact=self.exact)[1])
        return best

    def follow(self, run: Run) -> bool:
        """In-flight dedup (:func:`~llamapy.engine.cache.inflight.follow`)."""
        return follow(self, run)

    # --- dropping KV ---------------------------------------------------------------------------

    def discard(self, slot: Slot, keep: int) -> None:
        """Shrink ``slot``'s KV to its first ``keep`` tokens, first offering the whole prefix
        to the RAM cache (to the disk cache if RAM is off, or if it does not fit RAM's budget)
        when the tail about to go is at least the RAM cache's ``min_tokens``.

        The tail, not the share, decides: a conversation whose slot goes to another one that
        shares only its system prompt keeps more than half of its tokens, yet loses its whole
        history (in 16 interleaved chats on 4 slots, a rule of "offer when less than half is
        kept" lost a quarter of the later turns' histories)."""
        if keep >= len(slot.cached):
            return
        if len(slot.cached) - keep >= self.ram.min_tokens:
            self._offer(slot)
        self.trim(slot, keep)

    def _offer(self, slot: Slot) -> None:
        """Offer ``slot``'s whole prefix down the tiers until one takes or covers it."""
        tokens, key = slot.cached, slot.key
        get_size, get_data = self.rewinder.blob(slot)
        for tier in self.tiers:
            if tier.enabled and (tier.offer(key, tokens, get_size, get_data)
                                 or tier.covers(key, tokens)):
                return

    def _offer_disk(self, slot: Slot, *, wait: bool = False,
                    last_used_ns: int | None = None) -> None:
        if self.disk.enabled:
            get_size, get_data = self.rewinder.blob(slot)
            self.disk.offer(slot.key, slot.cached, get_size, get_data, wait=wait,
                            last_used_ns=last_used_ns)

    def close(self) -> None:
        """At the engine's close: :meth:`persist`, then let the disk cache finish its writes
        (those not started within ``tuning.disk_flush_s`` are dropped) and stop its threads."""
        try:
            self.persist()
        finally:
            self.disk.close(self.tuning.disk_flush_s)

    def persist(self) -> None:
        """Write what the slots and the RAM cache hold to the disk cache (at close, so a
        restarted server finds it), most recently used first (the close's time bound may cut
        the tail), each filed with a last use 1 ms before the one written before it so the
        disk's LRU order is theirs."""
        if not self.disk.enabled:
            return
        now = time.time_ns()
        slots = [s for s in sorted(self.pool.slots, key=lambda s: -s.last_used)
                 if s.cached and not self.ram.covers(s.key, s.cached)]
        for rank, slot in enumerate(slots):
            self._offer_disk(slot, wait=True, last_used_ns=now - rank * 1_000_000)
        for rank, entry in enumerate(self.ram.entries()[::-1], start=len(slots)):
            self.disk.offer_entry(entry, wait=True, last_used_ns=now - rank * 1_000_000)

    def trim(self, slot: Slot, keep: int) -> None:
        """Remove positions ``keep..``; without partial removal, back to the newest checkpoint
        at or before ``keep`` (everything when there is none)."""
        if keep >= len(slot.cached):
            return
        if keep and not self.backend.supports_partial_removal:
            keep = self.rewinder.rewind(slot, keep)
        if keep == 0 or not self.backend.seq_rm(slot.seq_id, keep, -1):
            self.backend.seq_rm(slot.seq_id, 0, -1)
            keep = 0
        del slot.cached[keep:]
        slot.checkpoints.drop_after(keep)

    def resync(self, slot: Slot) -> None:
        """Drop KV the backend may hold past ``slot.cached`` (after a failed decode)."""
        seq, n = slot.seq_id, len(slot.cached)
        if self.backend.seq_pos_max(seq) >= n and not self.backend.seq_rm(seq, n, -1):
            self.backend.seq_rm(seq, 0, -1)
            slot.cached.clear()
            slot.checkpoints.clear()

    def park_idle(self) -> None:
        """Move each idle slot's prefix to the RAM cache and free its cells (a unified KV
        cache with the RAM cache on; llama-server's ``cache_idle_slots`` does the same).

        With one pool of cells, every decode attends over all cells up to the highest in use,
        so the resident prefix of a slot nobody runs on slows every running sequence (one
        stream of SmolLM2 went from 10.8 to 14 ms a token after five requests had left their
        prefixes in the other slots). A parked prefix comes back with one copy from RAM. A
        prefix the RAM cache does not take (too short, over budget) stays where it is.
        """
        if not (self.cache_idle_slots and self.backend.kv_unified and self.ram.enabled):
            return
        holding = [s for s in self.pool.slots if s.cached and s.is_idle]  # usually none
        for slot in sorted(holding, key=lambda s: s.last_used):  # least recently used first
            if self._park(slot):
                self.counters.num_parked_slots += 1

    def _park(self, slot: Slot) -> bool:
        """Offer ``slot``'s prefix to the RAM cache; free its cells if RAM now holds it."""
        tokens = slot.cached
        self.ram.offer(slot.key, tokens, *self.rewinder.blob(slot))
        if not self.ram.covers(slot.key, tokens):
            return False
        self.trim(slot, 0)
        return True

    def purge_one(self) -> bool:
        """KV pressure: drop the least recently used idle slot's cache (offered to the RAM
        cache first). False when no idle slot holds KV, or when the KV is split per sequence
        (another sequence's cells could not make room)."""
        if not self.backend.kv_unified:
            return False
        for slot in self.pool.idle():
            if slot.cached:
                self.discard(slot, 0)
                self.counters.num_purged_slots += 1
                return True
        return False
