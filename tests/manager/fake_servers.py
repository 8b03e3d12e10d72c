"""A fake server factory for :class:`~llamapy.server.ModelManager` tests (no model needed).

Each fake ``Server`` "loads" until its model's gate is set (set by default), then fails if the
factory was told to; it records closes and fails a test that uses it after close.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from llamapy.server import ModelSpec


class FakeServer:
    """Stands in for ``Server``: a gated load and an idempotent close."""

    def __init__(self, spec: ModelSpec, gate: threading.Event, fail: BaseException | None,
                 log: list[tuple[str, str]]) -> None:
        self.name = spec.name
        self.closed = False
        self._gate = gate
        self._fail = fail
        self._log = log
        log.append(("start", spec.name))

    def wait_ready(self, timeout: float | None = None) -> FakeServer:
        self._gate.wait(timeout)
        if self._fail is not None:
            raise self._fail
        return self

    def close(self, timeout: float | None = 30.0) -> None:
        if not self.closed:
            self.closed = True
            self._log.append(("close", self.name))

    def use(self) -> str:
        """What a request does: fails if the server was closed under it."""
        assert not self.closed, f"{self.name} used after close"
        return self.name


class FakeFactory:
    """``server_factory`` for tests: per-model gates and failures, a log of starts/closes."""

    def __init__(self) -> None:
        self.gates: defaultdict[str, threading.Event] = defaultdict(self._open_gate)
        self.fail: dict[str, BaseException] = {}
        self.log: list[tuple[str, str]] = []
        self.made: list[FakeServer] = []

    @staticmethod
    def _open_gate() -> threading.Event:
        gate = threading.Event()
        gate.set()
        return gate

    def hold(self, name: str) -> threading.Event:
        """Make ``name``'s next loads block until the returned event is set."""
        gate = self.gates[name] = threading.Event()
        return gate

    def __call__(self, spec: ModelSpec) -> FakeServer:
        server = FakeServer(spec, self.gates[spec.name], self.fail.get(spec.name), self.log)
        self.made.append(server)
        return server

    def starts(self, name: str) -> int:
        """How many servers were started for ``name``."""
        return sum(1 for event in self.log if event == ("start", name))


def spec(name: str, mb: float = 10.0, **kw: object) -> ModelSpec:
    """A spec whose file need not exist (its memory is given)."""
    return ModelSpec(name=name, path=f"/models/{name}.gguf", memory_mb=mb, **kw)  # type: ignore[arg-type]
