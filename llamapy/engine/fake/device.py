"""The fake backend's asynchronous device: a step queue in real time.

``decode`` on a GPU returns once the step's graph is queued; reading the step's outputs waits
for it. :class:`Device` keeps when the last queued step ends (steps queue behind each other)
and :meth:`Device.wait` blocks until then: a sleep to just short of it (a sleep overshoots by
tens of microseconds, a device synchronisation does not), then yields of the GIL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["Device", "DeviceCost"]

#: How early the wait stops sleeping and starts yielding (seconds).
SLEEP_MARGIN_S = 0.0002


@dataclass(frozen=True, slots=True)
class DeviceCost:
    """The real time one decode takes on the simulated device: ``step_s`` for any batch,
    plus ``token_s`` per token of the batch and ``cell_s`` per KV cell its outputs attend
    to."""

    step_s: float
    token_s: float = 0.0
    cell_s: float = 0.0

    def step_time(self, n_tokens: int, n_cells: int) -> float:
        """Seconds of one decode of ``n_tokens`` whose output rows read ``n_cells``."""
        return self.step_s + self.token_s * n_tokens + self.cell_s * n_cells


class Device:
    """The queue of steps of one fake backend (see the module)."""

    def __init__(self, cost: DeviceCost) -> None:
        self.cost = cost
        self._ready_at = 0.0  # (perf_counter) when the last queued step's outputs are readable

    def queue(self, n_tokens: int, n_cells: int) -> None:
        """Queue a step (after the ones queued before it)."""
        start = max(time.perf_counter(), self._ready_at)
        self._ready_at = start + self.cost.step_time(n_tokens, n_cells)

    def wait(self) -> None:
        """Block until the last queued step's outputs are readable."""
        remaining = self._ready_at - time.perf_counter()
        if remaining > SLEEP_MARGIN_S:
            time.sleep(remaining - SLEEP_MARGIN_S)
        while time.perf_counter() < self._ready_at:
            time.sleep(0)
