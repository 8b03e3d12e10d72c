"""One model fingerprint (:mod:`llamapy.fingerprint`): the sha256 of the file, computed once per
version of the file, shared by concurrent callers, started in the background at idle priority
(a caller never waits for that one: it hashes itself, first result wins), and the same value for
every user (sessions, the disk cache's adapters, slot files). No model: the real-model side is
``tests/integration/test_fingerprint_users.py``."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import llamapy.fingerprint as fp
from llamapy.engine.kv_ops import KvState
from llamapy.engine.request import CacheKey
from llamapy.errors import InvalidRequestError
from llamapy.fingerprint import model_fingerprint, start_fingerprint
from llamapy.runtime.identity import describe_adapter_files
from llamapy.serve.routes import slot_files
from llamapy.session.manifest import file_digest


class CountingSha:
    """Wraps the fingerprint's hashing: counts the hashes made, holds the first on ``gate``
    and records the scheduling policy of the thread each ran on."""

    def __init__(self, compute: Callable[..., None]) -> None:
        self.compute = compute
        self.made = 0
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.priorities: list[tuple[int, int]] = []  # (scheduling policy, nice) per hash

    def __call__(self, *args: Any) -> None:
        self.made += 1
        if sys.platform.startswith("linux"):
            self.priorities.append((os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)))
        if self.made == 1:
            self.started.set()
            assert self.gate.wait(30), "the test never released the hash"
        self.compute(*args)


@pytest.fixture
def sha(monkeypatch: pytest.MonkeyPatch) -> CountingSha:
    counting = CountingSha(fp._compute)
    monkeypatch.setattr(fp, "_compute", counting)
    return counting


def model_file(tmp_path: Path, data: bytes, name: str = "model.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_the_fingerprint_is_the_files_sha256_and_a_copy_shares_it(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    a, b = model_file(tmp_path, data, "a.gguf"), model_file(tmp_path, data, "b.gguf")
    assert model_fingerprint(a) == hashlib.sha256(data).hexdigest()
    assert model_fingerprint(b) == model_fingerprint(a)  # content, not path
    assert model_fingerprint(model_file(tmp_path, data + b"x", "c.gguf")) != model_fingerprint(a)


def test_every_user_names_a_file_by_the_same_fingerprint(tmp_path: Path) -> None:
    path = model_file(tmp_path, b"weights" * 1000)
    digest = hashlib.sha256(b"weights" * 1000).hexdigest()
    assert file_digest(path) == digest  # sessions' manifests
    assert digest in describe_adapter_files(((str(path), 1.0),))  # the disk cache's adapters
    served: Any = SimpleNamespace(server=SimpleNamespace(
        model_path=str(path), model=SimpleNamespace(n_vocab=7)))
    assert slot_files._model_id(served)["model_fingerprint"] == digest  # slot files


def test_n_concurrent_callers_share_one_computation(tmp_path: Path, sha: CountingSha) -> None:
    path = model_file(tmp_path, b"x" * (1 << 20))
    n = 8
    barrier = threading.Barrier(n)
    results: list[str] = []

    def ask() -> None:
        barrier.wait()
        results.append(model_fingerprint(path))

    threads = [threading.Thread(target=ask) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sha.made == 1
    assert results == [hashlib.sha256(b"x" * (1 << 20)).hexdigest()] * n


def test_a_caller_does_not_wait_for_the_background_hash(tmp_path: Path,
                                                         sha: CountingSha) -> None:
    """The background hash runs at idle priority (it may not get a CPU for long on a busy
    machine): a caller hashes the file itself, and the background one stops at its next block."""
    data = b"y" * (3 * fp._BLOCK)
    path = model_file(tmp_path, data)
    sha.gate.clear()  # hold the background hash
    future = start_fingerprint(path)  # returns at once
    assert sha.started.wait(30) and not future.done()
    assert start_fingerprint(path) is future  # under way: not started twice
    assert model_fingerprint(path) == hashlib.sha256(data).hexdigest()  # not held: its own
    assert future.done() and sha.made == 2
    sha.gate.set()  # the background hash finds the result given and stops
    assert future.result(30) == hashlib.sha256(data).hexdigest()
    if sys.platform.startswith("linux"):  # SCHED_IDLE, or the nicest value where refused
        background, caller = sha.priorities
        assert background[0] == os.SCHED_IDLE or background[1] == 19, background
        assert caller[0] != os.SCHED_IDLE and caller[1] <= background[1], caller  # untouched


def test_a_background_hash_nobody_races_gives_the_result(tmp_path: Path,
                                                         sha: CountingSha) -> None:
    path = model_file(tmp_path, b"z" * 4096)
    future = start_fingerprint(path)
    assert future.result(30) == hashlib.sha256(b"z" * 4096).hexdigest()
    assert model_fingerprint(path) == future.result() and sha.made == 1  # memoized
    key, deadline = fp._key_of(path), time.monotonic() + 30
    while key in fp._background and time.monotonic() < deadline:  # the thread's last step
        time.sleep(0.01)
    assert key not in fp._background


def test_a_delayed_start_claims_nothing_until_its_timer_fires(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    timers: list[tuple[float, Callable[..., Any], tuple[Any, ...]]] = []

    class Timer:  # records the timer instead of running it, so the test fires it
        def __init__(self, delay: float, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
            timers.append((delay, fn, args))
            self.daemon = False

        def start(self) -> None:
            pass

    monkeypatch.setattr(fp.threading, "Timer", Timer)
    path = model_file(tmp_path, b"d" * 4096)
    assert start_fingerprint(path, delay=1.5) is None
    key = fp._key_of(path)
    assert key not in fp._known  # nothing claimed yet: a caller now would hash it itself
    ((delay, fn, args),) = timers
    assert delay == 1.5
    future = fn(*args)  # the timer fires
    assert future is fp._known[key]
    assert future.result(30) == hashlib.sha256(b"d" * 4096).hexdigest()


def test_a_changed_file_is_hashed_again(tmp_path: Path, sha: CountingSha) -> None:
    path = model_file(tmp_path, b"first version")
    first = model_fingerprint(path)
    assert model_fingerprint(path) == first and sha.made == 1  # memoized
    path.write_bytes(b"other version")  # same size
    os.utime(path, ns=(1, 1))  # and an mtime of its own
    assert model_fingerprint(path) == hashlib.sha256(b"other version").hexdigest() != first
    path.write_bytes(b"longer, third version")
    assert model_fingerprint(path) == hashlib.sha256(b"longer, third version").hexdigest()
    assert sha.made == 3


def test_a_missing_file_raises_and_a_started_one_fails_its_future(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        model_fingerprint(tmp_path / "gone.gguf")
    future = start_fingerprint(tmp_path / "gone.gguf")
    assert isinstance(future.exception(30), OSError)


def test_a_slot_file_of_another_model_file_is_refused() -> None:
    saved = KvState(b"kv", (1, 2, 3), CacheKey(None, ""))
    ours = {"model": "m.gguf", "model_fingerprint": "a" * 64, "n_vocab": 7}
    data = slot_files.encode(saved, ours)
    assert slot_files.decode(data, ours) == saved
    other = {**ours, "model_fingerprint": "b" * 64}  # same name and vocabulary, other bytes
    with pytest.raises(InvalidRequestError, match="another model file"):
        slot_files.decode(data, other)
