"""The engine's Backend contract tests, run against ``LlamaBackend`` on the real model.

Every test of ``tests/engine/test_backend_contract.py`` that takes the ``backend`` fixture is
collected here again with this module's fixture, so the fake and the real backend are held to
the same contract.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamapy._native import Context, Model
from llamapy.llama_backend import LlamaBackend

_SOURCE = Path(__file__).resolve().parents[1] / "engine" / "test_backend_contract.py"
_spec = importlib.util.spec_from_file_location("backend_contract", _SOURCE)
assert _spec is not None and _spec.loader is not None
_contract = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_contract)

CONTRACT_TESTS = sorted(
    name for name, fn in vars(_contract).items()
    if name.startswith("test_") and "backend" in inspect.signature(fn).parameters
)
globals().update({name: getattr(_contract, name) for name in CONTRACT_TESTS})


@pytest.fixture(scope="module")
def llama_model(model_path: Path) -> Iterator[Model]:
    with Model(model_path) as model:
        yield model


@pytest.fixture
def backend(llama_model: Model) -> Iterator[LlamaBackend]:
    """A fresh 4-sequence context with the fake fixture's limits (n_batch 32)."""
    with Context(llama_model, n_ctx=256, n_batch=32, n_ubatch=32, n_seq_max=4,
                 kv_unified=True, n_threads=2) as ctx:
        backend = LlamaBackend(llama_model, ctx)
        yield backend
        backend.close()


def test_every_contract_test_runs_here() -> None:
    assert len(CONTRACT_TESTS) >= 10
