"""uvicorn's server without its ten wake-ups a second.

``uvicorn.Server.main_loop`` sleeps 0.1 s at a time to refresh the ``date`` header (once a
second) and to notice an exit asked for by a signal. An idle server then spends a few ms of
CPU a second in Python, taken from ggml's threads of any process beside it (2 CPU s in a
35-minute benchmark while llama-server ran next to it). :class:`QuietServer` wakes once a
second for the header, and at once when a signal asks it to exit.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import FrameType

import uvicorn

__all__ = ["QuietServer"]

#: ``on_tick`` refreshes the headers when its counter is a multiple of this (once a second at
#: uvicorn's 0.1 s ticks).
_TICKS_PER_SECOND = 10


class QuietServer(uvicorn.Server):
    """A ``uvicorn.Server`` whose main loop blocks between its once-a-second duties."""

    #: Seconds between two ``on_tick`` calls (the ``date`` header's resolution).
    interval_s = 1.0
    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        """Call uvicorn's ``on_tick`` every :attr:`interval_s`, and at once after
        :meth:`handle_exit`, until it says to exit."""
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + _TICKS_PER_SECOND) % 864000
            with contextlib.suppress(asyncio.TimeoutError):  # (TimeoutError from 3.11 on)
                await asyncio.wait_for(self._wake.wait(), self.interval_s)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """uvicorn's signal handler, then wake the main loop (it may be blocked in it)."""
        super().handle_exit(sig, frame)
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)
