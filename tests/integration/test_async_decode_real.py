"""The engine's overlap of an asynchronous (GPU) decode, through libllama on the real model.

A model whose layers are on a GPU that computes asynchronously makes ``LlamaBackend`` report
``async_decode``; the engine then does a token's text and event after the next step is queued
and chains steady decode steps, each laid out while the one before computes
(:mod:`llamapy.engine.steady`). This machine has no GPU, so the tests force the flag on: a CPU
decode returns when its outputs are ready, so what they prove is that the overlapped order gives
the answers the plain order gives through the real backend (its sampler reading the rows of the
step just decoded, stop strings found a step later, the chain's filled-in tokens), not that it
is faster (``bench/bench_device.py`` measures that on the fake device).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from server_helpers import chat, wait_idle
from test_server import assert_same_up_to_a_near_tie, greedy_run

from llamapy._native import Model
from llamapy._native.devices import async_gpus, local_gpus
from llamapy.llama_backend import LlamaBackend
from llamapy.server import Server

OPTIONS = {"n_ctx": 2048, "n_parallel": 4, "n_batch": 512}
QUESTIONS = ["Name three rivers.", "What is the capital of Japan?", "Count to five.",
             "Describe a cat."]


def overlapped(model_path: Path, monkeypatch: pytest.MonkeyPatch) -> Server:
    """A server whose backend reports an asynchronous decode (see the module)."""
    monkeypatch.setattr(LlamaBackend, "async_decode", property(lambda self: True))
    return Server(model_path, **OPTIONS)


@pytest.fixture(scope="module")
def plain(model_path: Path) -> Iterator[Server]:
    with Server(model_path, **OPTIONS) as server:
        server.wait_ready(60)
        yield server


def test_a_stream_answers_as_on_a_synchronous_decode(
        plain: Server, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prompt = chat(plain, "Tell me a short story about a lighthouse.")
    expected = plain.complete(prompt, max_tokens=48, temp=0.0)
    stop = expected.text[len(expected.text) // 2:][:6]
    expected_stopped = plain.complete(prompt, max_tokens=48, temp=0.0, stop=[stop])
    with overlapped(model_path, monkeypatch) as server:
        server.wait_ready(60)
        done = server.complete(prompt, max_tokens=48, temp=0.0)
        stopped = server.complete(prompt, max_tokens=48, temp=0.0, stop=[stop])
        assert server.stats()["num_steady_steps"] > 0
        wait_idle(server)
    assert (done.text, done.finish_reason, done.completion_tokens) == (
        expected.text, expected.finish_reason, expected.completion_tokens)
    assert (stopped.text, stopped.finish_reason) == (
        expected_stopped.text, expected_stopped.finish_reason)
    assert stopped.finish_reason == "stop" and stop not in stopped.text


def test_concurrent_streams_answer_as_each_alone(
        plain: Server, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    solo = [greedy_run(plain, q, 24) for q in QUESTIONS]
    with overlapped(model_path, monkeypatch) as server:
        server.wait_ready(60)
        with ThreadPoolExecutor(len(QUESTIONS)) as pool:
            together = list(pool.map(lambda q: greedy_run(server, q, 24), QUESTIONS))
        wait_idle(server)
    for mine, theirs in zip(solo, together, strict=True):
        assert_same_up_to_a_near_tie(mine, theirs)


def test_only_a_model_on_an_asynchronous_gpu_is_overlapped(model_path: Path) -> None:
    """On a CPU a decode returns when its outputs are ready: overlapping it would only hold
    each token's event back by a step."""
    assert not async_gpus() or local_gpus()  # (this machine's build has no GPU: both empty)
    with Model(model_path) as model:
        assert model.computes_async == async_gpus()
    with Model(model_path, n_gpu_layers=0) as model:
        assert not model.computes_async
