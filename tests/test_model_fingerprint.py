"""One model fingerprint (:mod:`llamapy.fingerprint`): the sha256 of the file, computed once per
version of the file, shared by concurrent callers, off the caller's thread when started early,
and the same value for every user (sessions, the disk cache's adapters, slot files). No model:
the real-model side is ``tests/integration/test_fingerprint_users.py``."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import llamapy.fingerprint as fp
from llamapy.engine.request import CacheKey
from llamapy.engine.slot_ops import SlotSnapshot
from llamapy.errors import InvalidRequestError
from llamapy.fingerprint import model_fingerprint, start_fingerprint
from llamapy.runtime.identity import describe_adapter_files
from llamapy.serve import slot_files
from llamapy.session.manifest import file_digest


class CountingSha:
    """Wraps the fingerprint's hashing: counts the hashes made and holds each on ``gate``."""

    def __init__(self, compute: Callable[..., None]) -> None:
        self.compute = compute
        self.made = 0
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

    def __call__(self, *args: Any) -> None:
        self.made += 1
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


def test_a_started_fingerprint_runs_off_the_callers_thread_and_is_awaited(
        tmp_path: Path, sha: CountingSha) -> None:
    path = model_file(tmp_path, b"y" * 4096)
    sha.gate.clear()  # hold the background hash
    future = start_fingerprint(path)  # returns at once, the hash held
    assert sha.started.wait(30) and not future.done()
    waiter_result: list[str] = []
    waiter = threading.Thread(target=lambda: waiter_result.append(model_fingerprint(path)))
    waiter.start()
    assert start_fingerprint(path) is future  # under way: not started twice
    sha.gate.set()
    waiter.join(30)
    assert waiter_result == [future.result(30)] and sha.made == 1


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
    saved = SlotSnapshot(b"kv", (1, 2, 3), CacheKey(None, ""))
    ours = {"model": "m.gguf", "model_fingerprint": "a" * 64, "n_vocab": 7}
    data = slot_files.encode(saved, ours)
    assert slot_files.decode(data, ours) == saved
    other = {**ours, "model_fingerprint": "b" * 64}  # same name and vocabulary, other bytes
    with pytest.raises(InvalidRequestError, match="another model file"):
        slot_files.decode(data, other)
