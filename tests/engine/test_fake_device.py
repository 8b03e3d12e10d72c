"""The fake backend's asynchronous device: decode queues a step and returns; its outputs are
readable only once the step is done; steps queue behind each other; the serving stack runs on
it unchanged (``fake_server(device_step_s=...)``)."""

from __future__ import annotations

import time

from llamapy.engine.backend import BatchPlan, Segment
from llamapy.engine.fake.backend import DeviceCost, FakeBackend
from llamapy.server.fake import fake_server

STEP = 0.05


def test_outputs_are_read_only_after_the_step_and_steps_queue() -> None:
    backend = FakeBackend(n_ctx=64, n_seq_max=2, n_batch=32, device=DeviceCost(STEP))
    queued = time.perf_counter()
    backend.decode(BatchPlan([Segment(0, 0, [1, 2, 3], True)]))
    returned = time.perf_counter()
    backend.output_row(2)
    read = time.perf_counter()
    assert read - queued >= STEP > returned - queued  # decode returned before the step ended
    backend.decode(BatchPlan([Segment(0, 3, [4], True)]))
    backend.decode(BatchPlan([Segment(1, 0, [5], True)]))  # queued behind the one before
    backend.output_row(0)
    assert time.perf_counter() - read >= 2 * STEP


def test_the_step_grows_with_tokens_and_cells() -> None:
    cost = DeviceCost(0.002, token_s=0.001, cell_s=0.0001)
    assert cost.step_time(1, 0) < cost.step_time(10, 0) < cost.step_time(10, 100)


def test_a_server_on_the_device_generates_as_without_it() -> None:
    answers = []
    for options in ({}, {"device_step_s": 0.002}):
        with fake_server(n_ctx=256, n_parallel=2, **options) as server:  # type: ignore[arg-type]
            server.wait_ready(30)
            intent = server.resolve(max_tokens=12, temp=0.0, seed=3)
            done = server.complete_tokens([1, 2, 3, 4], intent)
            answers.append((done.text, done.completion_tokens))
    assert answers[0] == answers[1] and answers[0][1] > 0
