"""The fake backend's asynchronous device: a step queue in real time.

``decode`` on a GPU returns once the step's graph is queued; reading the step's outputs waits
for it. :class:`Device` keeps when the last queued step ends (steps queue behind each other).
A step starts when ``decode`` is called: the fake's own checks and KV writes, Python that
stands for what libllama does in C++ and on the device, run inside the step, so what a
benchmark sees between steps is the serving stack's own work.

:meth:`Device.wait` blocks until the step ends, as a CUDA synchronisation does: it sleeps
to :data:`SPIN_S` short of the end (a timed sleep wakes 50 to 150 us late: the kernel's timer
slack and the machine's wake latency), then spins, yielding the CPU and the GIL at each turn
(``sched_yield`` returns at once when no other thread wants the CPU), so it returns within
microseconds of the end. Spinning for the whole step would keep other threads from the GIL
(a thread that releases it and takes it back at once keeps it up to the switch interval).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

__all__ = ["Device", "DeviceCost"]

#: How long before the step's end the wait stops sleeping and spins (seconds).
SPIN_S = 0.0003
#: One yield of the CPU that releases the GIL (a timed sleep where the platform has none).
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


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

    def queue(self, n_tokens: int, n_cells: int, since: float | None = None) -> None:
        """Queue a step (after the ones queued before it) that began at ``since``
        (``perf_counter``; default now)."""
        start = max(time.perf_counter() if since is None else since, self._ready_at)
        self._ready_at = start + self.cost.step_time(n_tokens, n_cells)

    def wait(self) -> None:
        """Block until the last queued step's outputs are readable."""
        remaining = self._ready_at - time.perf_counter()
        if remaining > SPIN_S:
            time.sleep(remaining - SPIN_S)
        while time.perf_counter() < self._ready_at:
            _yield()
