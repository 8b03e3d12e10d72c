"""The tick loop's commands (what other threads put in its inbox) and how the tick thread
carries out, grants or refuses them, with no state of the loop's own."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from llamapy.engine.engine import Engine
from llamapy.engine.request import CacheKey, ErrorEvent, Request, RequestTimings
from llamapy.errors import LeaseTimeoutError, LlamapyError

__all__ = ["Call", "Cancel", "Close", "Lease", "Submit", "deliver_error", "grant_leases",
           "reject", "run_call"]

log = logging.getLogger("llamapy.runtime")


@dataclass(slots=True)
class Submit:
    """Queue a request."""

    request: Request


@dataclass(slots=True)
class Cancel:
    """Cancel a request."""

    request_id: Hashable


@dataclass(slots=True)
class Call:
    """Run ``fn(engine)`` on the tick thread; its result or error goes to ``future``."""

    fn: Callable[[Engine], Any]
    future: Future[Any]


@dataclass(slots=True)
class Lease:
    """Wait (until ``deadline``) for a slot to lease under ``key``."""

    key: CacheKey
    deadline: float
    future: Future[int]
    idle_s: float | None = None
    on_expire: Callable[[], None] | None = None


class Close:
    """End the loop."""


def grant_leases(engine: Engine, leases: list[Lease]) -> list[Lease]:
    """Give waiting sessions idle slots in arrival order; time out the overdue. The leases
    still waiting."""
    now, pending = time.monotonic(), []
    for want in leases:
        if want.future.cancelled():  # the caller gave up waiting
            continue
        try:
            lease_id = engine.lease(*want.key, idle_s=want.idle_s, on_expire=want.on_expire)
        except Exception as exc:  # typed, or a bug: that lease fails, the loop serves on
            want.future.set_exception(exc)
            continue
        if lease_id is not None:
            if want.future.set_running_or_notify_cancel():
                want.future.set_result(lease_id)
            else:  # its caller gave up meanwhile: nobody would release it
                engine.release(lease_id)
        elif now >= want.deadline:
            want.future.set_exception(LeaseTimeoutError("no slot could be leased in time"))
        else:
            pending.append(want)
    return pending


def reject(item: object, error: LlamapyError) -> None:
    """Answer a command the loop will not carry out with ``error``."""
    if isinstance(item, Submit):
        if item.request.sampler is not None:
            item.request.sampler.close()
        deliver_error(item.request, error)
    elif isinstance(item, Call | Lease) and not item.future.cancelled():
        item.future.set_exception(error)


def run_call(engine: Engine, item: Call) -> None:
    """Carry out a :class:`Call` that was not cancelled."""
    if item.future.set_running_or_notify_cancel():
        try:
            item.future.set_result(item.fn(engine))
        except BaseException as exc:
            item.future.set_exception(exc)


def deliver_error(request: Request, exc: LlamapyError) -> None:
    """End ``request`` with ``exc`` (a failing sink is logged)."""
    try:
        request.sink(ErrorEvent(request.request_id, exc, RequestTimings()))
    except Exception:
        log.exception("request sink failed")
