"""The HTTP server's main loop blocks between its duties and wakes at once to exit."""

from __future__ import annotations

import asyncio
import signal

import uvicorn

from llamapy.serve.quiet_uvicorn import QuietServer


async def _app(scope: object, receive: object, send: object) -> None:  # never called
    raise AssertionError


def test_the_main_loop_ticks_once_per_interval_and_wakes_to_exit() -> None:
    server = QuietServer(uvicorn.Config(_app))
    server.interval_s = 3600.0  # only a wake-up can end the loop within the test
    ticks: list[int] = []
    real_on_tick = server.on_tick

    async def on_tick(counter: int) -> bool:
        ticks.append(counter)
        return await real_on_tick(counter)

    server.on_tick = on_tick  # type: ignore[method-assign]

    async def scenario() -> None:
        loop = asyncio.create_task(server.main_loop())
        await asyncio.sleep(0.3)  # uvicorn's own loop would have ticked three times by now
        assert ticks == [0] and not loop.done()
        server.handle_exit(signal.SIGTERM, None)
        await asyncio.wait_for(loop, 10)

    asyncio.run(scenario())
    assert ticks == [0, 10]  # the header refresh still runs on each call (counter % 10 == 0)
    assert server.should_exit
    assert server.server_state.default_headers[0][0] == b"date"
