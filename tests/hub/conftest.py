"""Fixtures of the models-by-name tests: a Hub stand-in on 127.0.0.1 (``HF_ENDPOINT``) with a
fake repository of small GGUF-named files, a fresh huggingface_hub cache (``HF_HOME``) and a
fresh store (``LLAMAPY_MODELS_DIR``) per test. Nothing reaches the internet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_standin import TINY, HubStandin, Repo, tiny_files


@pytest.fixture()
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh huggingface_hub home and store; no token, online. Returns the HF home."""
    for name in ("HF_HUB_CACHE", "HF_TOKEN", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # restored after the test: --offline sets it
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("LLAMAPY_MODELS_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    return tmp_path / "hf"


@pytest.fixture()
def tiny_repo() -> Repo:
    return Repo(tiny_files())


@pytest.fixture()
def hub(hub_env: Path, tiny_repo: Repo, monkeypatch: pytest.MonkeyPatch
        ) -> Iterator[HubStandin]:
    """The stand-in serving :data:`TINY`, with ``HF_ENDPOINT`` pointing at it."""
    with HubStandin({TINY: tiny_repo}) as standin:
        monkeypatch.setenv("HF_ENDPOINT", standin.url)
        yield standin
