"""The async twins of the :class:`~llamapy.session.Session` primitives.

Each ``a*`` method is its blocking twin for a coroutine: same arguments, same results, same
errors, and no thread per call where the runtime avoids one. Prefills read their events on
the event loop (``AsyncRequestStream``) and engine calls are awaited (``Runtime.acall``);
``on_progress`` runs on the event loop. Cancelling the task that awaits a prefill cancels its
request and rolls the session back as an interrupted prefill does
(:mod:`llamapy.session.prefill`); the ``asyncio.CancelledError`` propagates. Two calls run in
a worker thread: :meth:`~AsyncPrimitives.aembed` (embeddings are computed on a private context
in the calling thread) and :meth:`~AsyncPrimitives.aclose` (closing a standalone session joins
its tick thread).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from llamapy.session.inputs import as_prefix, as_suffix
from llamapy.session.snapshot import SessionSnapshot
from llamapy.session.watch import CallWatch

if TYPE_CHECKING:
    from llamapy.engine.engine import Engine
    from llamapy.engine.kv_ops import KvState
    from llamapy.engine.request import RequestTimings
    from llamapy.runtime import Runtime
    from llamapy.session.config import PrefixInput, PrefixStatus, SuffixInput, SuffixStatus
    from llamapy.session.prefill import PrefillPlan, ProgressCallback

__all__ = ["AsyncPrimitives"]

S = TypeVar("S", bound="AsyncPrimitives")


class AsyncPrimitives:
    """The ``a*`` methods of :class:`~llamapy.session.Session` (see the module docstring)."""

    _runtime: Runtime
    _lease: int
    _stale: bool
    _watch: CallWatch | None

    if TYPE_CHECKING:  # defined by the session
        def _check_state(self) -> None: ...

        async def _async_generated(self) -> None: ...

        def _plan_prefix(self, prefix: PrefixInput) -> PrefillPlan: ...

        def _plan_suffix(self, suffix: SuffixInput) -> PrefillPlan: ...

        async def _aprefill(self, plan: PrefillPlan, watch: CallWatch,
                            on_progress: ProgressCallback | None,
                            loop: asyncio.AbstractEventLoop) -> RequestTimings: ...

        def _snapshot_of(self, state: KvState) -> SessionSnapshot: ...

        def _restore_fn(self, snapshot: SessionSnapshot) -> Callable[[Engine], bool]: ...

        def _restored(self, snapshot: SessionSnapshot, ok: bool) -> None: ...

        def _logits_fn(self) -> Callable[[Engine], Sequence[float]]: ...

        def snapshot(self, *, timeout: float | None = None) -> SessionSnapshot: ...

        def embed(self, text: str | Sequence[str]) -> np.ndarray: ...

        def close(self) -> None: ...

    @contextlib.asynccontextmanager
    async def _acall(self, what: str, timeout: float | None) -> AsyncIterator[CallWatch]:
        """One async primitive (as ``Session._call``, the check awaited)."""
        watch = CallWatch(self._runtime, timeout, what)
        self._check_state()
        if self._stale:
            await self._async_generated()
        self._watch = watch
        try:
            yield watch
        finally:
            self._watch = None
            watch.disarm()

    async def aensure_prefix(self, prefix: PrefixInput | str | Sequence[int], *,
                             timeout: float | None = None,
                             on_progress: ProgressCallback | None = None) -> PrefixStatus:
        """Async ``ensure_prefix``."""
        from llamapy.session.session import prefix_status

        value = as_prefix(prefix)
        async with self._acall("ensure_prefix", timeout) as watch:
            plan = self._plan_prefix(value)
            loop = asyncio.get_running_loop()
            timings = await self._aprefill(plan, watch, on_progress, loop)
        return prefix_status(plan, timings)

    async def aprefill_suffix(self, suffix: SuffixInput | str | Sequence[int], *,
                              timeout: float | None = None,
                              on_progress: ProgressCallback | None = None) -> SuffixStatus:
        """Async ``prefill_suffix``."""
        from llamapy.session.session import suffix_status

        value = as_suffix(suffix)
        async with self._acall("prefill_suffix", timeout) as watch:
            plan = self._plan_suffix(value)
            loop = asyncio.get_running_loop()
            timings = await self._aprefill(plan, watch, on_progress, loop)
        return suffix_status(plan, timings)

    async def asnapshot(self, *, timeout: float | None = None) -> SessionSnapshot:
        """Async ``snapshot``."""
        lease = self._lease
        async with self._acall("snapshot", timeout) as watch:
            state = await watch.acall(lambda engine: engine.leases.save(lease))
            return self._snapshot_of(state)

    async def arestore(self, snapshot: SessionSnapshot, *,
                       timeout: float | None = None) -> None:
        """Async ``restore``."""
        async with self._acall("restore", timeout) as watch:
            self._restored(snapshot, await watch.acall(self._restore_fn(snapshot)))

    async def asave_snapshot(self, name: str, *, timeout: float | None = None) -> bool:
        """Async ``save_snapshot`` (the file is written in a worker thread)."""
        data = (await self.asnapshot(timeout=timeout)).to_bytes()
        store = await self._runtime.acall(lambda engine: engine.disk)
        return bool(await asyncio.to_thread(store.save_blob, name, data))

    async def aload_snapshot(self, name: str, *, timeout: float | None = None) -> bool:
        """Async ``load_snapshot`` (the file is read in a worker thread)."""
        async with self._acall("load_snapshot", timeout) as watch:
            store = await watch.acall(lambda engine: engine.disk)
            data = await asyncio.to_thread(store.load_blob, name)
            if data is None:
                return False
            snapshot = SessionSnapshot.from_bytes(data)
            self._restored(snapshot, await watch.acall(self._restore_fn(snapshot)))
        return True

    async def anext_token_logits(self, *, timeout: float | None = None) -> np.ndarray:
        """Async ``next_token_logits``."""
        async with self._acall("next_token_logits", timeout) as watch:
            logits = await watch.acall(self._logits_fn())
            return np.array(logits, dtype=np.float32, copy=True)

    async def aembed(self, text: str | Sequence[str]) -> np.ndarray:
        """Async ``embed``, in a worker thread (embeddings run on a private context in the
        calling thread)."""
        return await asyncio.to_thread(self.embed, text)

    async def aclose(self) -> None:
        """Async ``close``, in a worker thread (a standalone session joins its tick thread)."""
        await asyncio.to_thread(self.close)

    async def __aenter__(self: S) -> S:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
