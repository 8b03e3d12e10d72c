"""The media encoder's queue (:mod:`llamapy.media.queue`) on the fake projector: tenants take
turns one encode step at a time (a burst of one tenant delays another's single image by the
step under way, not by the burst), and the bytes of media waiting for the encoder are bounded
overall and per tenant (over the bound a request waits, then gets a typed 429). Checked by the
order of encode steps, never by timing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from llamapy.engine.fake.media import FAKE_MEDIA_WIDTH, fake_media_tokens
from llamapy.errors import MediaBusyError, MediaError, MediaMemoryError
from llamapy.media import FakeMediaEncoder
from llamapy.media.probe import probe
from llamapy.media.queue import EncoderQueue, decoded_bytes
from llamapy.media.samples import png, wav
from llamapy.options.limits import RequestLimits

LIMITS = RequestLimits()
#: Bound on waiting for a thread to reach a point (a bound, not a speed figure).
WAIT_S = 30.0
MARKER = "<__media__>"


def tokenize(text: str, add_special: bool, parse_special: bool) -> list[int]:
    return [1 + len(word) for word in text.split()]


def image(n: int, side: int = 64) -> bytes:
    """A distinct ``side`` x ``side`` image (decoded: ``3 * side * side`` bytes)."""
    return png(side, side, (n % 256, n // 256, 7))


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


class Projector:
    """A fake encoder whose encode steps are recorded in order, each ``(tenant, item)``; a
    step listed in ``hold`` blocks until :meth:`release` (holding the projector)."""

    def __init__(self, queue: EncoderQueue | None = None) -> None:
        self.encoder = FakeMediaEncoder(tokenize, audio=True, queue=queue)
        self.queue = self.encoder.queue
        self.order: list[tuple[str | None, int]] = []
        self.held_seen: list[tuple[int, int]] = []
        self.hold: dict[tuple[str | None, int], threading.Event] = {}
        self.entered: dict[tuple[str | None, int], threading.Event] = {}
        self.encoder.on_encode = self._step

    def _step(self, tenant: str | None, index: int) -> None:
        self.order.append((tenant, index))
        self.held_seen.append((self.queue.held_bytes, self.queue.held_by(tenant)))
        if (tenant, index) in self.hold:
            self.entered[(tenant, index)].set()
            assert self.hold[(tenant, index)].wait(WAIT_S)

    def holding(self, tenant: str | None, index: int = 0) -> None:
        """Block the step ``(tenant, index)`` when it comes."""
        self.hold[(tenant, index)] = threading.Event()
        self.entered[(tenant, index)] = threading.Event()

    def wait_entered(self, tenant: str | None, index: int = 0) -> None:
        assert self.entered[(tenant, index)].wait(WAIT_S)

    def release(self, tenant: str | None, index: int = 0) -> None:
        self.hold[(tenant, index)].set()


@contextmanager
def requests(projector: Projector) -> Iterator[Callable[..., threading.Thread]]:
    """Start requests on threads (``start(tenant, media)``); every one is joined at the end
    and its outcome (its prompt, or the error it raised) kept in ``thread.outcome``."""
    threads: list[threading.Thread] = []

    def start(tenant: str | None, media: list[bytes]) -> threading.Thread:
        def run() -> None:
            try:
                thread.outcome = projector.encoder.prompt(  # type: ignore[attr-defined]
                    "look " + MARKER * len(media), media, LIMITS, tenant=tenant)
            except Exception as exc:  # kept for the test to look at
                thread.outcome = exc  # type: ignore[attr-defined]

        thread = threading.Thread(target=run, daemon=True)
        threads.append(thread)
        thread.start()
        return thread

    try:
        yield start
    finally:
        for event in projector.hold.values():
            event.set()
        for thread in threads:
            thread.join(WAIT_S)
            assert not thread.is_alive()


def outcome(thread: threading.Thread) -> Any:
    return thread.outcome  # type: ignore[attr-defined]


# --- turns ------------------------------------------------------------------------------------


def test_a_burst_delays_another_tenants_image_by_one_step_not_the_burst() -> None:
    projector = Projector()
    projector.holding("a", 0)
    with requests(projector) as start:
        burst = start("a", [image(i) for i in range(8)])
        projector.wait_entered("a", 0)
        single = start("b", [image(100)])
        wait_until(lambda: projector.queue.waiting_steps("b") == 1, "b's step waiting")
        projector.release("a", 0)
    assert projector.order == [("a", 0), ("b", 0), *(("a", i) for i in range(1, 8))]
    assert len(outcome(burst).media) == 8 and len(outcome(single).media) == 1


def test_tenants_take_turns_least_recently_served_first() -> None:
    projector = Projector()
    projector.holding("a", 0)
    with requests(projector) as start:
        start("a", [image(i) for i in range(4)])
        projector.wait_entered("a", 0)
        start("b", [image(10), image(11)])
        wait_until(lambda: projector.queue.waiting_steps("b") == 1, "b waiting")
        start("c", [image(20)])
        start("b", [image(12)])
        wait_until(lambda: projector.queue.waiting_steps() == 3, "b, c and b waiting")
        projector.release("a", 0)
    tenants = [tenant for tenant, _ in projector.order]
    # one step of each other tenant at most between two steps of a tenant that waits
    assert tenants == ["a", "b", "c", "a", "b", "a", "b", "a"]


def test_one_tenant_alone_is_served_in_arrival_order_step_by_step() -> None:
    projector = Projector()
    with requests(projector) as start:
        start(None, [image(1), image(2)])
    assert projector.order == [(None, 0), (None, 1)]
    assert projector.queue.held_bytes == 0 and projector.queue.waiting_steps() == 0


# --- bytes ------------------------------------------------------------------------------------


def charge(media: list[bytes]) -> int:
    """The bytes a request of ``media`` holds once its prompt is cut."""
    return decoded_bytes(media, [probe(m) for m in media], 16000) + sum(
        fake_media_tokens(m) * FAKE_MEDIA_WIDTH * 4 for m in media)


def test_a_request_larger_than_a_tenants_bound_is_refused_before_decoding() -> None:
    big = png(1000, 1000)
    queue = EncoderQueue(tenant_max_bytes=3 * 1000 * 1000 - 1)
    projector = Projector(queue)
    with pytest.raises(MediaError) as caught:
        projector.encoder.prompt(MARKER, [big], LIMITS, tenant="a")
    assert caught.value.reason == "too_large" and projector.order == []
    assert queue.held_bytes == 0 and queue.waiting_requests == 0


def test_embeddings_that_could_never_fit_are_a_400_not_a_429() -> None:
    """Bytes a request adds later (its embeddings) past one tenant's whole bound can never
    fit: a typed 400 at once, not a 429 a client would retry forever."""
    queue = EncoderQueue(tenant_max_bytes=1000)
    with queue.admit("a", 600) as held:
        with pytest.raises(MediaError) as caught:
            held.grow(500)
        assert caught.value.reason == "too_large" and caught.value.http_status == 400
        assert not isinstance(caught.value, MediaMemoryError)
    assert queue.held_bytes == 0


def test_a_tenant_over_its_bound_waits_while_another_tenant_is_served() -> None:
    one = [image(1)]
    queue = EncoderQueue(tenant_max_bytes=charge(one) + charge(one) // 2)
    projector = Projector(queue)
    projector.holding("a", 0)
    with requests(projector) as start:
        first = start("a", one)
        projector.wait_entered("a", 0)
        second = start("a", [image(2)])  # a's bound is full: it waits for room
        wait_until(lambda: queue.waiting_requests == 1, "a's second request waiting")
        other = start("b", [image(3)])
        wait_until(lambda: queue.waiting_steps("b") == 1, "b's step waiting")
        projector.release("a", 0)
    assert projector.order == [("a", 0), ("b", 0), ("a", 0)]
    assert all(tenant <= queue.tenant_max_bytes for _, tenant in projector.held_seen)
    assert all(not isinstance(outcome(t), Exception) for t in (first, second, other))
    assert queue.held_bytes == 0


def test_the_bound_over_all_tenants_holds_and_a_wait_ends_in_a_429() -> None:
    one = [image(1)]
    queue = EncoderQueue(max_bytes=charge(one) + charge(one) // 2, wait_s=0.05)
    projector = Projector(queue)
    projector.holding("a", 0)
    with requests(projector) as start:
        start("a", one)
        projector.wait_entered("a", 0)
        refused = start("b", [image(2)])  # no room overall: it waits, then gives up
        refused.join(WAIT_S)
        projector.release("a", 0)
    assert isinstance(outcome(refused), MediaMemoryError)
    assert outcome(refused).http_status == 429
    assert projector.order == [("a", 0)] and queue.held_bytes == 0
    assert all(total <= queue.max_bytes for total, _ in projector.held_seen)


def test_audio_is_charged_before_it_is_decoded() -> None:
    clip = wav(2.0, rate=8000)
    queue = EncoderQueue(tenant_max_bytes=decoded_bytes([clip], [probe(clip)], 16000) - 1)
    with pytest.raises(MediaError, match="decodes to"):
        FakeMediaEncoder(tokenize, audio=True, queue=queue).prompt(MARKER, [clip], LIMITS)
    assert decoded_bytes([clip], [probe(clip)], 16000) >= 4 * 32000  # float samples at 16 kHz


# --- waiting ----------------------------------------------------------------------------------


def test_the_requests_waiting_are_bounded_per_tenant_not_across_tenants() -> None:
    projector = Projector(EncoderQueue(max_waiting=1))
    projector.holding("a", 0)
    with requests(projector) as start:
        start("a", [image(1)])
        projector.wait_entered("a", 0)
        start("a", [image(2)])
        wait_until(lambda: projector.queue.waiting_requests == 1, "a's second waiting")
        with pytest.raises(MediaBusyError):
            projector.encoder.prompt(MARKER, [image(3)], LIMITS, tenant="a")
        other = start("b", [image(4)])
        wait_until(lambda: projector.queue.waiting_steps("b") == 1, "b waiting")
        projector.release("a", 0)
    assert not isinstance(outcome(other), Exception)
    assert [t for t, _ in projector.order] == ["a", "b", "a"]
