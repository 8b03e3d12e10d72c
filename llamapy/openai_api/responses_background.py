"""Background responses (``background: true``): answered at once, run on, polled.

A background request is validated and prepared first (a bad one is its 4xx, as ever), then
answered with the response object at ``status: "queued"`` while its generation runs in a task
of this process (:class:`BackgroundRuns`). The stored object goes ``queued`` ->
``in_progress`` -> ``completed`` / ``incomplete`` (the output and usage in it), ``failed``
(with ``error``) or ``cancelled`` (``POST /v1/responses/{id}/cancel``), and ``GET
/v1/responses/{id}`` reads it at every stage. So a background response must be stored:
``store: false`` with it is a 400, and so is ``stream: true`` (poll instead).

A response still running cannot be continued (``previous_response_id``: a 400 until it is
done). Each stored running object names the process running it (its pid and a per-process
token, in a field clients never see); one whose process is gone (the server stopped while it
ran) reads as ``failed``. At most :data:`MAX_BACKGROUND` run at once in a process (more is a
429), on top of which the engine's own queue bounds apply as to any request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import InvalidOptionError, LlamapyError, QueueFullError
from .response_store import ResponseStore
from .responses_state import Stored, echo, record

__all__ = ["MAX_BACKGROUND", "OWNER", "RUNNING", "BackgroundRuns", "visible"]

log = logging.getLogger(__name__)

#: The statuses of a background response that has not ended.
RUNNING = ("queued", "in_progress")
#: Background responses one process runs at once.
MAX_BACKGROUND = 256
#: The stored field naming the process that runs a background response (never shown).
OWNER = "_llamapy_owner"
#: This process's token (a pid alone could be a later process's).
_BOOT = uuid.uuid4().hex


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _failed(response: dict[str, Any], code: str, message: str) -> dict[str, Any]:
    return {**response, "status": "failed", "error": {"code": code, "message": message}}


class BackgroundRuns:
    """The background responses this process runs, by tenant and id."""

    def __init__(self, store: ResponseStore, limit: int = MAX_BACKGROUND) -> None:
        self.store = store
        self.limit = limit
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}

    def check_request(self, request: Any, stored: Stored) -> None:
        """Refuse (400) a background request that could not be polled: not stored, or
        streamed; 429 when :data:`MAX_BACKGROUND` already run."""
        if not stored.store:
            raise InvalidOptionError("background responses are stored: store must not be "
                                     "false", option="store")
        if isinstance(request, dict) and request.get("stream"):
            raise InvalidOptionError("background responses are not streamed: poll "
                                     "GET /v1/responses/{id}", option="stream")
        if len(self._tasks) >= self.limit:
            raise QueueFullError(self.limit)

    async def start(self, stored: Stored, queued: dict[str, Any],
                    work: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """Keep ``queued`` (echoed) and run ``work`` (the finished response) in a task; the
        queued object, as the client gets it."""
        response = {**echo(stored, dict(queued)), "status": "queued", "background": True}
        await asyncio.to_thread(self._put, stored, {**response, OWNER: [os.getpid(), _BOOT]})
        key = (stored.tenant, response["id"])
        self._tasks[key] = asyncio.get_running_loop().create_task(
            self._run(stored, response, work), name=f"background {response['id']}")
        return response

    def _put(self, stored: Stored, response: dict[str, Any]) -> None:
        self.store.put_response(stored.tenant, response, stored.own_input,
                                stored.previous_response_id)

    def _end(self, stored: Stored, final: dict[str, Any]) -> None:
        if final.get("status") in ("completed", "incomplete"):
            record(self.store, stored, final)  # (its conversation's items too)
        else:
            self._put(stored, final)

    async def _run(self, stored: Stored, queued: dict[str, Any],
                   work: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        final = queued
        try:
            await asyncio.to_thread(self._put, stored, {**queued, "status": "in_progress",
                                                        OWNER: [os.getpid(), _BOOT]})
            final = {**echo(stored, await work()), "background": True}
        except asyncio.CancelledError:
            final = {**queued, "status": "cancelled"}
            raise
        except LlamapyError as exc:
            final = _failed(queued, exc.error_type, str(exc))
        except Exception as exc:  # never out of the task: the object says what happened
            log.exception("background response %s failed", queued["id"])
            final = _failed(queued, "server_error", f"internal error: {exc!r}")
        finally:  # recorded before it stops counting as running (a poll between reads it)
            try:
                with contextlib.suppress(Exception):  # (a store closed at shutdown)
                    await asyncio.shield(asyncio.to_thread(self._end, stored, final))
            finally:
                self._tasks.pop((stored.tenant, queued["id"]), None)

    def running(self, tenant: str, response_id: str) -> bool:
        """Whether this process runs ``response_id`` now."""
        return (tenant, response_id) in self._tasks

    async def cancel(self, tenant: str, response_id: str) -> bool:
        """Cancel a running background response (True), waiting until it is recorded."""
        task = self._tasks.get((tenant, response_id))
        if task is None:
            return False
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return True

    async def close(self) -> None:
        """Cancel every running background response (the server stops)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def visible(runs: BackgroundRuns | None, tenant: str, response: dict[str, Any]
            ) -> dict[str, Any]:
    """A stored response as clients see it: without its owner; a running one whose process
    is gone (or whose task here is) as ``failed``."""
    owner = response.pop(OWNER, None)
    if response.get("status") not in RUNNING or not isinstance(owner, list):
        return response
    pid, boot = owner if len(owner) == 2 else (0, "")
    if boot == _BOOT:
        alive = runs is not None and runs.running(tenant, str(response.get("id")))
    else:
        alive = isinstance(pid, int) and pid > 0 and _alive(pid)
    if alive:
        return response
    return _failed(response, "server_error", "the server running this background response "
                                             "stopped before it ended")
