"""Stateful property test of pinned RAM prompt-cache entries.

Rules offer ordinary prefixes, pin prefixes (of random keys and tenants, lengths, times to live
and sizes, over a tiny token alphabet so prefixes cover each other), advance the clock and
look up. A shadow model remembers each prefix pinned (``PINNED``, ``WRITTEN`` or
``REFRESHED``) with its deadline. Checked after every step:

- ``check_integrity`` (bytes, per-tenant bytes, the prefix index, the pins' bookkeeping, pins
  within ``pin_share`` of the budget and of each tenant's bound);
- a pinned prefix stays held until its deadline: some entry under its key holds it, whatever
  was offered or pinned since;
- a pin of a prefix the shadow holds as live answers ``REFRESHED`` (never writes again).
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from llamapy.engine.cache.pin_table import PinOutcome
from llamapy.engine.cache.ram import PromptCache
from llamapy.engine.request import CacheKey

KEYS = (CacheKey(None, "", (), None), CacheKey(None, "", (), "a"), CacheKey(None, "", (), "b"),
        CacheKey("s", "", (), "a"))
TOKENS = st.lists(st.integers(1, 3), min_size=1, max_size=6)
LIVE = (PinOutcome.PINNED, PinOutcome.WRITTEN, PinOutcome.REFRESHED)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class PinMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.cache = PromptCache(1000, min_tokens=1, tenant_share=0.6, clock=self.clock)
        self.pinned: dict[tuple[CacheKey, tuple[int, ...]], float] = {}

    @rule(key=st.sampled_from(KEYS), tokens=TOKENS, size=st.integers(10, 400))
    def offer(self, key: CacheKey, tokens: list[int], size: int) -> None:
        self.cache.offer(key, tokens, lambda: size, lambda: b"x" * size)

    @rule(key=st.sampled_from(KEYS), tokens=TOKENS, cut=st.integers(0, 5),
          ttl=st.sampled_from([1.0, 5.0, 300.0]), size=st.integers(10, 400))
    def pin(self, key: CacheKey, tokens: list[int], cut: int, ttl: float, size: int) -> None:
        pin_len = max(1, len(tokens) - cut)
        prefix = tuple(tokens[:pin_len])
        live = self.pinned.get((key, prefix), -1.0) > self.clock.t
        outcome = self.cache.pin(key, tokens, pin_len, ttl, lambda: size, lambda: b"x" * size)
        if live:
            assert outcome is PinOutcome.REFRESHED
        if outcome in LIVE:
            self.pinned[(key, prefix)] = max(self.pinned.get((key, prefix), -1.0),
                                             self.clock.t + ttl)

    @rule(dt=st.sampled_from([0.5, 2.0, 10.0, 400.0]))
    def advance(self, dt: float) -> None:
        self.clock.t += dt

    @rule(key=st.sampled_from(KEYS), tokens=TOKENS)
    def lookup(self, key: CacheKey, tokens: list[int]) -> None:
        entry, n = self.cache.lookup(key, tokens, cap=len(tokens))
        if entry is not None:
            self.cache.touch(entry)
            assert 0 < n <= len(tokens)

    @invariant()
    def integrity(self) -> None:
        self.cache.check_integrity()

    @invariant()
    def live_pins_are_held(self) -> None:
        for (key, prefix), deadline in self.pinned.items():
            if deadline > self.clock.t:
                assert self.cache.covers(key, prefix), (key, prefix, deadline, self.clock.t)


TestPinMachine = PinMachine.TestCase
