"""A stateful test of ModelManager on fake servers: random acquires, releases, loads, unloads
and pins of three models under a two-model budget. After every step the manager's own
``check_integrity()`` holds, every held lease's server is open and loaded, and each model's
``in_flight`` equals the leases the test holds on it (the shadow model)."""

from __future__ import annotations

import time

from fake_servers import FakeFactory, spec
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from llamapy.errors import ModelBudgetError, NotReadyError
from llamapy.server import ModelLease, ModelManager, ModelState

NAMES = ("a", "b", "c")


class ManagerMachine(RuleBasedStateMachine):
    """Shadow: the leases held, by model."""

    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.factory = FakeFactory()
        specs = [spec("a", 30), spec("b", 30, keep_alive=0), spec("c", 50)]
        self.manager = ModelManager(specs, models_max=2, memory_mb=90,
                                    server_factory=self.factory)  # type: ignore[arg-type]
        self.held: list[ModelLease] = []

    @rule(target=leases, name=st.sampled_from(NAMES))
    def acquire(self, name: str) -> ModelLease | None:
        try:
            lease = self.manager.acquire(name, timeout=0.05)
        except ModelBudgetError:
            pinned = [s for s in self.manager.status()
                      if s.pinned and s.state is ModelState.LOADED]
            assert self.held or pinned, "no room although nothing is in use or pinned"
            return None
        except NotReadyError:  # the instant fake load outran 50 ms (a GC pause, a busy CPU)
            self._settle(name)
            return None
        assert lease.server.use() == name
        self.held.append(lease)
        return lease

    def _settle(self, name: str) -> None:
        """Wait (bounded) for a load that outlasted an acquire's timeout: it must end."""
        deadline = time.monotonic() + 5.0
        while self.manager.status_of(name).state is ModelState.LOADING:
            assert time.monotonic() < deadline, f"load of {name!r} never ended"
            time.sleep(0.01)

    @rule(lease=consumes(leases))
    def release(self, lease: ModelLease | None) -> None:
        if lease is not None:
            self.held.remove(lease)
            lease.release()

    @rule(name=st.sampled_from(NAMES))
    def unload(self, name: str) -> None:
        state = self.manager.unload(name).state
        in_use = any(lease.name == name for lease in self.held)
        assert (state is ModelState.UNLOADED) == (not in_use)

    @rule(name=st.sampled_from(NAMES), pinned=st.booleans())
    def pin(self, name: str, pinned: bool) -> None:
        self.manager.pin(name, pinned)

    @invariant()
    def consistent(self) -> None:
        self.manager.check_integrity()
        for lease in self.held:
            assert not lease.server.closed
            assert self.manager.status_of(lease.name).state is ModelState.LOADED
        for status in self.manager.status():
            assert status.in_flight == sum(lease.name == status.name for lease in self.held)

    def teardown(self) -> None:
        for lease in self.held:
            lease.release()
        self.manager.close()


TestManagerMachine = ManagerMachine.TestCase
#: Bounded in every profile: a step may wait (a load thread, a 50 ms budget wait).
TestManagerMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
