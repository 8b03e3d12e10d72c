"""On the real model: loading it starts its fingerprint in the background, and a session's
manifest and the disk cache's namespace name it by that one fingerprint (the file's sha256)."""

from __future__ import annotations

import hashlib
from concurrent.futures import Future
from pathlib import Path

import pytest

from llamapy._native import Context, Model
from llamapy._native import model as model_module
from llamapy._native.context import ContextOptions
from llamapy.fingerprint import start_fingerprint
from llamapy.runtime.native import namespace_parts
from llamapy.session.host import model_manifest


def test_a_loaded_model_is_named_by_one_fingerprint(model_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    digest = hashlib.sha256(model_path.read_bytes()).hexdigest()
    started: list[Future[str]] = []

    def start(path: Path) -> Future[str]:
        started.append(start_fingerprint(path))
        return started[-1]

    monkeypatch.setattr(model_module, "start_fingerprint", start)
    with Model(model_path) as model:
        assert len(started) == 1 and started[0].result(60) == digest  # the load started it
        assert model_manifest(model, {}).model_digest == digest  # sessions
        ctx = Context(model, ContextOptions(n_ctx=256, n_batch=256, n_seq_max=1))
        try:
            assert namespace_parts(model, ctx)["model"] == digest  # the disk prompt cache
        finally:
            ctx.close()
