"""The budget rule of a :class:`~llamapy.server.ModelManager`, as pure functions over its
entries (called with the manager's lock held).

A model fits when the resident models (loaded or loading) plus it stay within ``models_max``
models and ``memory_mb`` MiB (0: no limit). To make room, idle models are unloaded least
recently used first; a model with a lease or a waiter, a loading one and a pinned one are never
chosen. A model that cannot fit next to the pinned models alone can never be loaded: that is a
:class:`~llamapy.errors.ModelBudgetError` at once, not a wait.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import LlamapyError, ModelBudgetError
from .model_spec import ModelSpec, ModelState, check_transition

__all__ = ["Entry", "check_entries", "fits", "plan_room"]


@dataclass(slots=True)
class Entry:
    """One served model's mutable state (guarded by its manager's lock)."""

    spec: ModelSpec
    keep_alive: float
    memory_mb: float
    pinned: bool
    state: ModelState = ModelState.UNLOADED
    server: Any = None
    error: LlamapyError | None = None
    users: int = 0  # leases held plus requesters waiting for it
    holds: int = 0  # read-only views holding it loaded (not uses)
    last_used: float = 0.0
    unload_pending: bool = False

    def move(self, target: ModelState) -> None:
        """Change state by the transition table (an illegal transition raises)."""
        check_transition(self.state, target)
        self.state = target

    @property
    def evictable(self) -> bool:
        """Loaded, unused, unheld, unpinned: the budget and the idle TTL may unload it."""
        return (self.state is ModelState.LOADED and self.users == 0 and self.holds == 0
                and not self.pinned)


def fits(resident: list[Entry], need_mb: float, models_max: int, memory_mb: float) -> bool:
    """Whether one more model of ``need_mb`` fits next to ``resident``."""
    if models_max and len(resident) + 1 > models_max:
        return False
    used = sum(e.memory_mb for e in resident)
    return not memory_mb or used + need_mb <= memory_mb


def plan_room(entries: Iterable[Entry], entry: Entry, models_max: int, memory_mb: float
              ) -> list[Entry] | None:
    """The idle models to unload (LRU first) so ``entry`` fits; None when it cannot fit until
    a lease ends; raises :class:`ModelBudgetError` when it can never fit."""
    resident = [e for e in entries if e.state in (ModelState.LOADED, ModelState.LOADING)]
    fixed = [e for e in resident if e.pinned]
    if not fits(fixed, entry.memory_mb, models_max, memory_mb):
        raise ModelBudgetError(
            f"model {entry.spec.name!r} ({entry.memory_mb:.0f} MiB) does not fit the budget "
            f"(models_max={models_max}, memory_mb={memory_mb:.0f}) next to the pinned models "
            f"{[e.spec.name for e in fixed]}")
    idle = sorted((e for e in resident if e.evictable), key=lambda e: e.last_used)
    victims: list[Entry] = []
    while not fits([e for e in resident if e not in victims], entry.memory_mb, models_max,
                   memory_mb):
        if not idle:
            return None
        victims.append(idle.pop(0))
    return victims


def check_entries(entries: list[Entry], models_max: int, memory_mb: float) -> None:
    """Raise ``AssertionError`` unless the entries are consistent: a server exactly when
    loaded, an error exactly when failed, no negative use counts, the budget kept."""
    for e in entries:
        assert (e.server is not None) == (e.state is ModelState.LOADED), (e.spec.name, e.state)
        assert (e.error is not None) == (e.state is ModelState.FAILED), (e.spec.name, e.state)
        assert e.users >= 0, (e.spec.name, e.users)
    resident = [e for e in entries if e.state in (ModelState.LOADED, ModelState.LOADING)]
    assert not models_max or len(resident) <= models_max, [e.spec.name for e in resident]
    used = sum(e.memory_mb for e in resident)
    assert not memory_mb or used <= memory_mb + 1e-9, used
