"""The Server on the runtime, on the real model: ids to cancel by, abandoned streams, a tick
that fails, the model's lifetime, and session embeddings under the session's adapters."""

from __future__ import annotations

import gc
import itertools
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from server_helpers import wait_idle

from llamapy.engine import DecodeMaximal
from llamapy.errors import CancelledError, EngineError, NotRunningError
from llamapy.server import Server
from llamapy.session import AdapterSpec, SessionConfig
from llamapy.testing import write_random_lora

PROMPT = "<|im_start|>user\nTell me a long story about a cat.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def small(model_path: Path) -> Iterator[Server]:
    with Server(model_path, n_ctx=2048, n_parallel=2, n_batch=256, chunk_size=128) as s:
        s.wait_ready(60)
        yield s


def cancelled(server: Server) -> int:
    return int(server.stats()["num_cancelled"])


def test_generate_is_cancelled_from_another_thread_by_its_request_id(small: Server) -> None:
    before = cancelled(small)

    def cancel_once_running() -> None:  # (an id the server does not know yet is ignored)
        deadline = time.monotonic() + 60
        while small.stats()["slots_active"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        small.cancel("story-1")

    threading.Thread(target=cancel_once_running, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(CancelledError):
        small.generate(PROMPT, max_tokens=1500, request_id="story-1", temp=0.0,
                       logit_bias={small.model.eos: float("-inf")})
    assert time.monotonic() - started < 10
    wait_idle(small)
    assert cancelled(small) - before == 1


def test_a_stream_carries_its_id_and_the_server_cancels_it(small: Server) -> None:
    before = cancelled(small)
    stream = small.stream(PROMPT, max_tokens=1500, temp=0.0)
    assert stream.request_id is not None
    next(stream)
    small.cancel(stream)
    with pytest.raises(CancelledError):
        list(stream)
    wait_idle(small)
    assert cancelled(small) - before == 1


def test_an_islice_that_is_dropped_cancels_the_rest(small: Server) -> None:
    before = cancelled(small)
    first = list(itertools.islice(small.stream(PROMPT, max_tokens=1500, temp=0.0), 3))
    assert len(first) == 3
    gc.collect()
    stats = wait_idle(small)
    assert cancelled(small) - before == 1
    assert all(slot["state"] == "idle" for slot in stats["slots"])


class FlakyStrategy(DecodeMaximal):
    """Raises on its first ``failures`` decisions, then schedules normally."""

    name = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def allocate(self, view):  # type: ignore[no-untyped-def]
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("strategy bug")
        return super().allocate(view)


def test_a_broken_strategy_ends_requests_at_once_and_the_server_keeps_serving(
        model_path: Path) -> None:
    with Server(model_path, n_ctx=1024, n_parallel=2, batch_strategy=FlakyStrategy(2)) as s:
        s.wait_ready(60)
        for _ in range(2):
            started = time.monotonic()
            with pytest.raises(EngineError, match="strategy bug"):
                s.generate(PROMPT, max_tokens=8, temp=0.0)
            assert time.monotonic() - started < 5
        assert s.stats()["slots_active"] == 0 and s.stats()["num_errors"] == 2
        assert len(s.complete(PROMPT, max_tokens=4, temp=0.0).token_ids) == 4


def test_a_fetched_model_outlives_the_server_and_is_freed_with_its_last_holder(
        model_path: Path) -> None:
    server = Server(model_path, n_ctx=512, n_parallel=1)
    model = server.wait_ready(60).model
    server.close()
    with pytest.raises(NotRunningError):
        _ = server.model
    assert model.tokenize("still works", False, False)  # the holder keeps it alive
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None

    lone = Server(model_path, n_ctx=512, n_parallel=1)
    lone.wait_ready(60)
    lone_ref = weakref.ref(lone.model)
    lone.close()
    gc.collect()
    assert lone_ref() is None  # nobody held it: freed with the server


def test_session_embeddings_on_a_server_use_the_sessions_adapters(
        small: Server, model_path: Path, tmp_path: Path) -> None:
    lora = write_random_lora(model_path, tmp_path / "e.gguf", rank=4, std=0.3, seed=5)
    texts = ["a cat sat on the mat", "quarterly revenue grew"]
    with small.open_session() as base:
        plain = base.embed(texts)
    with small.open_session(SessionConfig(adapters=(AdapterSpec(path=str(lora)),))) as tuned:
        adapted = tuned.embed(texts)
        again = tuned.embed(texts)
    assert plain.shape == adapted.shape
    assert not np.allclose(plain, adapted, atol=1e-3)
    np.testing.assert_allclose(adapted, again, atol=1e-5)
    wait_idle(small)
