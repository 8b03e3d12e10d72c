"""The media encoder's queue: whose step the shared projector runs next, and how many bytes of
media may wait for it.

**Turns.** A model has one projector, not thread-safe, shared by every request. A request's
work on it is cut into *steps* of about one encode each: its first step decodes its media,
cuts its prompt into chunks and encodes its first media chunk; each later step encodes one
more chunk (a chunk found in the encoder's cache takes no step). Between two steps the request
gives the projector back (:meth:`Turn.next`) and waits in its tenant's line again. When the
projector comes free it goes to the waiting step of the tenant served least recently (a tenant
never served first; ties in arrival order), each tenant's steps in arrival order. So a tenant's
burst (one request of 8 large images, or 8 requests) never holds the projector for more than
one step while another tenant waits: a tenant that waits is served right after the step under
way, unless other tenants that waited are served less recently still (then one step of each,
at most). Within one tenant, requests go step by step in turn, in arrival order.

**Memory.** Before anything of a request is decoded, :meth:`EncoderQueue.admit` holds the bytes
its media decodes to (:func:`decoded_bytes`: an image 3 bytes a pixel, from its header; an audio
clip its samples as the projector takes them and the working copy they are read through), and
once its prompt is cut it holds the bytes of the embeddings it will make as well
(:meth:`Held.grow`), until its prompt is made (or it fails). The bytes held by every request
stay within ``max_bytes``, and one tenant's within ``tenant_max_bytes``: a request that does not
fit waits for room (at most ``wait_s``), then fails with
:class:`~llamapy.errors.MediaMemoryError` (a 429); a request larger than a tenant's bound alone
is refused at once (:class:`~llamapy.errors.MediaError`, reason ``too_large``): it could never
fit. Growing by the embeddings never waits (a request holding bytes must not wait for another
that holds bytes too): it fails the same way when it does not fit. So what media costs in memory
while it waits for, or is in, the encoder is bounded, whatever the requests.

**Waiting.** Each request waiting for its first step (for room or a turn) holds a worker
thread: at most ``max_waiting`` of one tenant and ``max_waiting_total`` in all wait at once; one
more is refused with :class:`~llamapy.errors.MediaBusyError` (a 429). A step waits at most
``wait_s`` for its turn (then the same error). Nothing here is native: the real encoder and the
fake one share it.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from llamapy.errors import MediaBusyError, MediaError, MediaMemoryError

from .audio import wav_decoded_bytes
from .probe import MediaInfo

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_TENANT_MAX_BYTES", "EncoderQueue", "Held", "Turn",
           "decoded_bytes"]

#: Bytes of media all requests may hold waiting for (or in) the encoder.
DEFAULT_MAX_BYTES = 1 << 30
#: Bytes of media one tenant's requests may hold.
DEFAULT_TENANT_MAX_BYTES = 512 << 20
#: Bytes a pixel of a decoded image takes (RGB).
IMAGE_PIXEL_BYTES = 3


def decoded_bytes(media: Sequence[bytes], infos: Sequence[MediaInfo], rate: int) -> int:
    """What ``media`` (checked: ``infos``) takes decoded: images 3 bytes a pixel, audio as
    :func:`~llamapy.media.audio.wav_decoded_bytes` reads it for a projector at ``rate``."""
    return sum(info.pixels * IMAGE_PIXEL_BYTES if info.kind == "image"
               else wav_decoded_bytes(data, rate) for data, info in zip(media, infos,
                                                                        strict=True))


@dataclass(eq=False)
class _Step:
    """A step waiting for the projector."""

    tenant: str | None
    serial: int
    granted: bool = False


@dataclass(eq=False)
class Held:
    """The bytes one request holds (see :meth:`EncoderQueue.admit`); ``waiting`` until its
    first step starts."""

    queue: EncoderQueue
    tenant: str | None
    nbytes: int = 0
    waiting: bool = True

    def grow(self, nbytes: int) -> None:
        """Hold ``nbytes`` more, at once or :class:`~llamapy.errors.MediaMemoryError`."""
        self.queue._grow(self, nbytes)


@dataclass(eq=False)
class Turn:
    """A request's hold on the projector (see :meth:`EncoderQueue.turn`)."""

    queue: EncoderQueue
    tenant: str | None
    holding: bool = True

    def next(self) -> None:
        """Start the request's next step: the projector goes to whoever's turn it is first
        (at once back to this request when no other step waits)."""
        self.queue._pass(self)


class EncoderQueue:
    """Turns on one projector and the bytes of media waiting for it (see the module)."""

    #: Tenants whose last turn is remembered (a forgotten one counts as never served).
    max_remembered = 1024

    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 tenant_max_bytes: int = DEFAULT_TENANT_MAX_BYTES, max_waiting: int = 4,
                 max_waiting_total: int = 16, wait_s: float = 60.0) -> None:
        self.max_bytes = max_bytes
        self.tenant_max_bytes = min(tenant_max_bytes, max_bytes)
        self.max_waiting = max_waiting
        self.max_waiting_total = max_waiting_total
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self._busy = False
        self._steps: list[_Step] = []
        self._serials = itertools.count(1)
        self._served: dict[str | None, int] = {}
        self._clock = itertools.count(1)
        self._held: Counter[str | None] = Counter()
        self._waiting: Counter[str | None] = Counter()

    # --- bytes -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def admit(self, tenant: str | None, nbytes: int) -> Iterator[Held]:
        """Hold ``nbytes`` for a request of ``tenant`` (waiting for room) until the block ends;
        the request counts as waiting until its first :meth:`turn` starts."""
        if nbytes > self.tenant_max_bytes:
            raise MediaError(f"this request's media decodes to {nbytes} bytes, more than the "
                             f"{self.tenant_max_bytes} bytes one tenant's media may hold",
                             reason="too_large")
        held = Held(self, tenant)
        with self._cond:
            self._enter_waiting(tenant)
            try:
                self._wait_room(tenant, nbytes)
            except BaseException:
                self._stop_waiting(held)
                raise
            self._take(held, nbytes)
        try:
            yield held
        finally:
            with self._cond:
                self._stop_waiting(held)
                self._take(held, -held.nbytes)
                self._cond.notify_all()

    def _wait_room(self, tenant: str | None, nbytes: int) -> None:
        deadline = time.monotonic() + self.wait_s
        while (refusal := self._no_room(tenant, nbytes)) is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise refusal
            self._cond.wait(left)

    def _no_room(self, tenant: str | None, nbytes: int) -> MediaMemoryError | None:
        """Why ``nbytes`` more of ``tenant`` do not fit now (None: they do)."""
        if self._held[tenant] + nbytes > self.tenant_max_bytes:
            return MediaMemoryError(self.tenant_max_bytes)
        if sum(self._held.values()) + nbytes > self.max_bytes:
            return MediaMemoryError(self.max_bytes)
        return None

    def _take(self, held: Held, nbytes: int) -> None:
        held.nbytes += nbytes
        self._held[held.tenant] += nbytes
        if self._held[held.tenant] <= 0:
            del self._held[held.tenant]

    def _grow(self, held: Held, nbytes: int) -> None:
        if held.nbytes + nbytes > self.tenant_max_bytes:  # never fits: no retry would help
            raise MediaError(f"this request's media and embeddings take more than the "
                             f"{self.tenant_max_bytes} bytes one tenant's media may hold",
                             reason="too_large")
        with self._cond:
            refusal = self._no_room(held.tenant, nbytes)
            if refusal is not None:
                raise refusal
            self._take(held, nbytes)

    @property
    def held_bytes(self) -> int:
        """Bytes held now by all requests."""
        with self._cond:
            return sum(self._held.values())

    def held_by(self, tenant: str | None) -> int:
        """Bytes held now by ``tenant``'s requests."""
        with self._cond:
            return self._held[tenant]

    # --- waiting -----------------------------------------------------------------------------

    def _enter_waiting(self, tenant: str | None) -> None:
        if (self._waiting[tenant] >= self.max_waiting
                or sum(self._waiting.values()) >= self.max_waiting_total):
            raise MediaBusyError(self.max_waiting)
        self._waiting[tenant] += 1

    def _stop_waiting(self, held: Held) -> None:
        if not held.waiting:
            return
        held.waiting = False
        self._waiting[held.tenant] -= 1
        if self._waiting[held.tenant] <= 0:
            del self._waiting[held.tenant]

    @property
    def waiting_requests(self) -> int:
        """Requests waiting for room or for their first step now."""
        with self._cond:
            return sum(self._waiting.values())

    def waiting_steps(self, tenant: str | None = None) -> int:
        """Steps waiting for the projector now (of ``tenant`` only, when given)."""
        with self._cond:
            return sum(1 for step in self._steps if tenant is None or step.tenant == tenant)

    # --- turns -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def turn(self, held: Held) -> Iterator[Turn]:
        """Hold the projector for the first step of ``held``'s request (waiting for its turn),
        and between its later steps (:meth:`Turn.next`), until the block ends."""
        with self._cond:
            try:
                self._acquire(held.tenant)
            finally:
                self._stop_waiting(held)
        turn = Turn(self, held.tenant)
        try:
            yield turn
        finally:
            with self._cond:
                if turn.holding:
                    self._release()

    def _pass(self, turn: Turn) -> None:
        with self._cond:
            if not self._steps:
                self._note_served(turn.tenant)
                return
            turn.holding = False
            self._release()
            self._acquire(turn.tenant)
            turn.holding = True

    def _acquire(self, tenant: str | None) -> None:
        """Wait (holding the condition) until a step of ``tenant`` is granted the projector."""
        step = _Step(tenant, next(self._serials))
        self._steps.append(step)
        if not self._busy:
            self._grant()
        deadline = time.monotonic() + self.wait_s
        while not step.granted:
            if not self._cond.wait(max(0.0, deadline - time.monotonic())) and not step.granted:
                self._steps.remove(step)
                raise MediaBusyError(self.max_waiting)

    def _release(self) -> None:
        self._busy = False
        self._grant()

    def _grant(self) -> None:
        """Give the free projector to the next step (see the module), if one waits."""
        if not self._steps:
            return
        step = min(self._steps, key=lambda s: (self._served.get(s.tenant, 0), s.serial))
        self._steps.remove(step)
        self._note_served(step.tenant)
        step.granted = True
        self._busy = True
        self._cond.notify_all()

    def _note_served(self, tenant: str | None) -> None:
        self._served.pop(tenant, None)
        self._served[tenant] = next(self._clock)  # (insertion order: least recent first)
        while len(self._served) > self.max_remembered:
            del self._served[next(iter(self._served))]
