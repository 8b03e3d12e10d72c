"""ModelManager on the real model: two models (SmolLM2 under two names) answer alternately,
the budget unloads one and the next request reloads it, a request in flight survives the load
of another model, and a broken GGUF fails alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamapy.errors import LoadFailedError
from llamapy.server import ModelManager, ModelSpec, ModelState

OPTIONS = {"n_ctx": 512, "n_parallel": 1, "n_batch": 256, "n_threads": 1}
ASK = {"max_tokens": 8, "temp": 0.0, "timeout": 60}


def specs(model_path: Path, *names: str) -> list[ModelSpec]:
    return [ModelSpec(name=n, path=model_path, options=OPTIONS) for n in names]


def ask(manager: ModelManager, name: str) -> str:
    with manager.acquire(name, timeout=60) as server:
        return str(server.generate("The capital of France is", **ASK))


def test_two_models_answer_alternately(model_path: Path) -> None:
    with ModelManager(specs(model_path, "one", "two")) as manager:
        answers = [ask(manager, name) for name in ("one", "two", "one", "two")]
        assert answers[0] == answers[1] == answers[2] == answers[3] != ""
        assert {s.state for s in manager.status()} == {ModelState.LOADED}


def test_the_budget_unloads_and_the_next_request_reloads(model_path: Path) -> None:
    with ModelManager(specs(model_path, "one", "two"), models_max=1) as manager:
        first = ask(manager, "one")
        assert ask(manager, "two") == first
        assert manager.status_of("one").state is ModelState.UNLOADED
        assert ask(manager, "one") == first
        assert manager.status_of("two").state is ModelState.UNLOADED


def test_a_request_in_flight_survives_another_models_load(model_path: Path) -> None:
    with ModelManager(specs(model_path, "one", "two"), models_max=2) as manager:
        lease = manager.acquire("one", timeout=60)
        chunks = lease.server.stream("Count: 1, 2, 3,", max_tokens=24, temp=0.0,
                                     timeout=60)
        head = next(iter(chunks))
        assert ask(manager, "two") != ""
        rest = "".join(chunks)
        lease.release()
        assert head + rest != ""
        assert manager.status_of("one").state is ModelState.LOADED


def test_a_broken_gguf_fails_alone(model_path: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    with ModelManager([*specs(model_path, "good"),
                       ModelSpec(name="broken", path=broken, options=OPTIONS)]) as manager:
        with pytest.raises(LoadFailedError):
            ask(manager, "broken")
        assert ask(manager, "good") != ""
        status = manager.status_of("broken")
        assert status.state is ModelState.FAILED and status.error


@pytest.mark.second_model
def test_two_families_alternate_and_the_budget_reloads(model_path: Path,
                                                        second_model_path: Path) -> None:
    specs = [ModelSpec(name="smol", path=model_path, options=OPTIONS),
             ModelSpec(name="gemma", path=second_model_path, options=OPTIONS)]
    with ModelManager(specs, models_max=1) as manager:
        with manager.acquire("smol", timeout=60) as server:
            assert "llama" in server.model.description.lower()
        first = ask(manager, "gemma")
        with manager.acquire("gemma", timeout=60) as server:
            assert "gemma3" in server.model.description
        assert manager.status_of("smol").state is ModelState.UNLOADED
        assert ask(manager, "smol") != ""
        assert manager.status_of("gemma").state is ModelState.UNLOADED
        assert ask(manager, "gemma") == first  # reloaded, greedy: the same answer
