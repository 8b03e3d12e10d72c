"""Prefix reuse: which KV a run starts from, and what happens to KV that is dropped.

Sources for a newly admitted run, longest match wins, ties to the cheaper
(own < donor < RAM < disk):

- **own**: the longest common prefix of the slot's cached tokens and the prompt;
- **donor** (``kv_unified`` only): another slot's computed tokens, adopted by a metadata-only
  ``seq_cp`` (an active slot counts with the tokens it has already computed);
- **RAM**: a :class:`~llamapy.engine.cache.ram.PromptCache` entry restored with
  ``state_seq_set`` and trimmed to the match (a failed restore clears the sequence and the run
  prefills from scratch);
- **disk**: a :class:`~llamapy.engine.cache.disk.DiskPromptCache` entry, read and verified off
  the tick thread (:mod:`llamapy.engine.cache.disk_reads`; the run waits unresolved meanwhile), then
  restored like a RAM entry. A read that fails (file vanished or corrupt) is counted and the
  run chooses again without it.

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
``cache_prompt=False`` neither reuses nor retains; backends without partial removal reuse only
exact prefixes.

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
from llamapy.engine.cache.disk_reads import DiskReads, ReadStatus
from llamapy.engine.cache.disk_store import StoredFile
from llamapy.engine.cache.pinning import plan_pins, reuse_for_pins, write_pins
from llamapy.engine.cache.ram import CacheEntry, PromptCache, common_prefix
from llamapy.engine.options import EngineTuning
from llamapy.engine.request import Run
from llamapy.engine.slots import Slot, SlotPool
from llamapy.engine.states import SlotState
from llamapy.engine.stats import Counters, InstabilityEvent

__all__ = ["PrefixResolver"]

_COST_ORDER = {"own": 0, "donor": 1, "ram": 2, "disk": 3}


class _Choice(NamedTuple):
    source: str
    n: int
    donor: Slot | None = None
    ram: CacheEntry | None = None
    disk: StoredFile | CacheEntry | None = None


class PrefixResolver:
    """Applies reuse decisions to the backend and keeps ``slot.cached`` exact."""

    def __init__(self, backend: Backend, pool: SlotPool, ram: PromptCache, counters: Counters,
                 tuning: EngineTuning, on_instability: Callable[[InstabilityEvent], None],
                 disk: DiskPromptCache, *, cache_idle_slots: bool = True) -> None:
        self.backend = backend
        self.cache_idle_slots = cache_idle_slots
        self.pool = pool
        self.ram = ram
        self.disk = disk
        self.reads = DiskReads(disk, tuning.disk_read_wait_s)
        self.counters = counters
        self.tuning = tuning
        self.on_instability = on_instability
        self.can_share = backend.kv_unified and backend.supports_partial_removal
        self.exact = not backend.supports_partial_removal

    # --- admission -----------------------------------------------------------------------------

    def resolve(self, run: Run) -> bool:
        """Pick and apply the reuse source for a run just placed on ``run.slot``. False, with
        nothing applied (the run stays ``RESOLVING``), while the best source is a disk entry
        still being read: call again on a later tick."""
        slot = run.slot
        assert slot is not None, "resolve: run has no slot"
        if not run.cache_prompt:
            run.machine.fire("resolve")
            self.discard(slot, 0)
            slot.key = run.key
            return True
        choice, data = self._choose(run, slot), None
        if choice.source == "disk" and choice.disk is not None:
            status, data = self.reads.poll(run.serial, choice.disk)
            if status is ReadStatus.PENDING:
                return False
            if status is ReadStatus.FAILED:
                self.counters.num_disk_failures += 1
                choice = self._choose(run, slot, disk=False)
        self.reads.forget(run.serial)
        run.machine.fire("resolve")
        self._note_instability(run, slot)
        run.pins = plan_pins(run, self.ram)
        self._apply(run, slot, choice._replace(n=reuse_for_pins(run, self.ram, choice.n)), data)
        self.write_pins(run)
        return True

    def write_pins(self, run: Run) -> None:
        """Pin the prefixes of ``run``'s ``cache_pins`` its slot now holds
        (:mod:`llamapy.engine.cache.pinning`)."""
        if run.pins and run.slot is not None:
            write_pins(run, run.slot, self.ram, self.disk, self.backend)

    def _apply(self, run: Run, slot: Slot, choice: _Choice, data: bytes | None) -> None:
        source, n = choice.source, choice.n
        if source == "own":
            self.discard(slot, n)
        else:
            self.discard(slot, 0)
            if source == "donor" and choice.donor is not None:
                self.backend.seq_cp(choice.donor.seq_id, slot.seq_id, 0, n)
                slot.cached = run.prompt[:n]
            elif source == "ram" and choice.ram is not None:
                n = self._restore(slot, choice.ram, n)
            elif source == "disk" and choice.disk is not None and data is not None:
                n = self._restore_disk(slot, choice.disk, data, n)
        slot.key = run.key
        self._record(run, source if n else None, n)

    def _choose(self, run: Run, slot: Slot, *, disk: bool = True) -> _Choice:
        own = self._own(run, slot)
        donor, n_donor = self._best_donor(run, slot) if self.can_share else (None, 0)
        entry, n_ram = self.ram.lookup(run.key, run.prompt, run.reuse_cap, exact=self.exact)
        options = [_Choice("own", own), _Choice("donor", n_donor, donor=donor),
                   _Choice("ram", n_ram, ram=entry)]
        best = max(o.n for o in options)
        if disk and self.disk.enabled:
            stored, n_disk = self.disk.lookup(run.key, run.prompt, run.reuse_cap,
                                              exact=self.exact)
            if n_disk > best:  # disk only when strictly longer: it is the costliest source
                return _Choice("disk", n_disk, disk=stored)
        return max(options, key=lambda o: (o.n, -_COST_ORDER[o.source]))

    def _own(self, run: Run, slot: Slot) -> int:
        if slot.key != run.key:
            return 0
        n = min(common_prefix(slot.cached, run.prompt), run.reuse_cap)
        if n < len(slot.cached) and not self.backend.supports_partial_removal:
            return 0
        return n

    def _best_donor(self, run: Run, slot: Slot, floor: int = 0) -> tuple[Slot | None, int]:
        best, best_n = None, floor
        for other in self.pool.slots:
            if other is slot or other.key != run.key or len(other.cached) <= best_n:
                continue
            n = min(common_prefix(other.cached, run.prompt), run.reuse_cap)
            if n > best_n:
                best, best_n = other, n
        return best, best_n

    def _restore_disk(self, slot: Slot, entry: StoredFile | CacheEntry, data: bytes,
                      n: int) -> int:
        if not self.load(slot, data, self.disk.token_ids(entry)):
            self.counters.num_disk_failures += 1
            return 0
        self.disk.touch(entry)
        self.counters.num_disk_restores += 1
        self.trim(slot, n)
        return len(slot.cached)

    def _restore(self, slot: Slot, entry: CacheEntry, n: int) -> int:
        if not self.load(slot, entry.data, entry.token_ids):
            self.counters.num_ram_restore_failures += 1
            return 0
        self.ram.touch(entry)
        self.counters.num_ram_restores += 1
        self.trim(slot, n)
        return len(slot.cached)

    def load(self, slot: Slot, data: bytes, token_ids: Sequence[int]) -> bool:
        """Replace ``slot``'s KV with serialised state holding ``token_ids``. False (the slot
        then empty) when the backend refuses it or it holds another number of positions."""
        ok = self.backend.state_seq_set(slot.seq_id, data)
        if not ok or self.backend.seq_pos_max(slot.seq_id) != len(token_ids) - 1:
            self.backend.seq_rm(slot.seq_id, 0, -1)
            slot.cached = []
            return False
        slot.cached = list(token_ids)
        return True

    def _record(self, run: Run, source: str | None, n: int) -> None:
        run.timings.reused_tokens = n
        run.timings.reuse_source = source
        if source == "own":
            self.counters.num_reused_own += n
        elif source == "donor":
            self.counters.num_reused_donor += n
        elif source == "ram":
            self.counters.num_reused_ram += n
        elif source == "disk":
            self.counters.num_reused_disk += n

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
        for cache in (self.ram, self.disk):
            if cache.enabled:
                best = max(best, cache.lookup(run.key, run.prompt, run.reuse_cap,
                                              exact=self.exact)[1])
        return best

    # --- in-flight dedup -----------------------------------------------------------------------

    def follow(self, run: Run) -> bool:
        """Adopt what other slots computed of ``run``'s prompt; True if ``run`` should wait
        this tick for a slot that is computing more of it."""
        slot = run.slot
        if slot is None or not (self.tuning.inflight_dedup and self.can_share and run.cache_prompt):
            return False
        have = len(slot.cached)
        if have >= run.reuse_cap:
            return False
        donor, n = self._best_donor(run, slot, floor=have)
        if donor is not None:
            self.backend.seq_cp(donor.seq_id, slot.seq_id, have, n)
            slot.cached.extend(run.prompt[have:n])
            self.counters.num_reused_inflight += n - have
            run.timings.inflight_tokens += n - have
            have = n
        return self._leader_ahead(run, slot, have)

    def _leader_ahead(self, run: Run, slot: Slot, have: int) -> bool:
        for other in self.pool.slots:
            lead = other.run
            if lead is None or other is slot or other.state is not SlotState.PREFILLING:
                continue
            if other.key != run.key or len(other.cached) != have or lead.serial > run.serial:
                continue
            shared = min(common_prefix(lead.prompt, run.prompt), run.reuse_cap)
            if shared - have >= self.tuning.follow_min_tokens:
                return True
        return False

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
        """Offer ``slot``'s whole prefix to the RAM cache, else to the disk cache."""
        seq, tokens = slot.seq_id, slot.cached
        if self.ram.enabled and (
                self.ram.offer(slot.key, tokens, lambda: self.backend.state_seq_size(seq),
                               lambda: self.backend.state_seq_get(seq))
                or self.ram.covers(slot.key, tokens)):
            return
        self._offer_disk(slot)

    def _offer_disk(self, slot: Slot, *, wait: bool = False,
                    last_used_ns: int | None = None) -> None:
        seq = slot.seq_id
        if self.disk.enabled:
            self.disk.offer(slot.key, slot.cached, lambda: self.backend.state_seq_size(seq),
                            lambda: self.backend.state_seq_get(seq), wait=wait,
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
        """Remove positions ``keep..`` (everything if partial removal is unsupported)."""
        if keep >= len(slot.cached):
            return
        if keep == 0 or not self.backend.seq_rm(slot.seq_id, keep, -1):
            self.backend.seq_rm(slot.seq_id, 0, -1)
            keep = 0
        del slot.cached[keep:]

    def resync(self, slot: Slot) -> None:
        """Drop KV the backend may hold past ``slot.cached`` (after a failed decode)."""
        seq, n = slot.seq_id, len(slot.cached)
        if self.backend.seq_pos_max(seq) >= n and not self.backend.seq_rm(seq, n, -1):
            self.backend.seq_rm(seq, 0, -1)
            slot.cached.clear()

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
        seq, tokens = slot.seq_id, slot.cached
        self.ram.offer(slot.key, tokens, lambda: self.backend.state_seq_size(seq),
                       lambda: self.backend.state_seq_get(seq))
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
