"""On the real model: a server starts its model's fingerprint a moment after the model is
hosted (not while the weights load), and a session's manifest and the disk cache's namespace
name the model by that one fingerprint (the file's sha256)."""

from __future__ import annotations

import hashlib
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

import llamapy.fingerprint as fp
from llamapy._native import Context, Model
from llamapy._native.context import ContextOptions
from llamapy.runtime.native import namespace_parts
from llamapy.server import Server
from llamapy.server import loop as server_loop
from llamapy.session.host import model_manifest


def test_a_server_starts_the_fingerprint_once_its_model_is_hosted(
        model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    digest = hashlib.sha256(model_path.read_bytes()).hexdigest()
    started: list[tuple[Path, float, int]] = []
    hosted: list[int] = []
    host_model = server_loop.host_model

    def host(*args: Any, **kwargs: Any) -> Any:
        result = host_model(*args, **kwargs)
        hosted.append(len(started))  # how many fingerprints had started by then
        return result

    def start(path: Path, delay: float = 0.0) -> Future[str] | None:
        started.append((Path(path), delay, len(hosted)))
        return fp.start_fingerprint(path)

    monkeypatch.setattr(server_loop, "host_model", host)
    monkeypatch.setattr(server_loop, "start_fingerprint", start)
    with Server(model_path, n_ctx=256, n_parallel=1) as server:
        server.wait_ready(60).fetch_model()
    assert hosted == [0]  # none during the load
    # one, after the model was hosted, delayed past the requests that follow a start
    assert started == [(model_path, server_loop.FINGERPRINT_DELAY_S, 1)]
    assert server_loop.FINGERPRINT_DELAY_S > 0
    assert fp.model_fingerprint(model_path) == digest


def test_a_loaded_model_is_named_by_one_fingerprint(model_path: Path) -> None:
    digest = hashlib.sha256(model_path.read_bytes()).hexdigest()
    with Model(model_path) as model:
        assert model_manifest(model, {}).model_digest == digest  # sessions
        ctx = Context(model, ContextOptions(n_ctx=256, n_batch=256, n_seq_max=1))
        try:
            assert namespace_parts(model, ctx)["model"] == digest  # the disk prompt cache
        finally:
            ctx.close()
