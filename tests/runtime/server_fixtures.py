"""Shared helpers of the Server API tests on the fake backend: a server whose model load waits
for a gate (a slow load), and the engine counters a test compares."""

from __future__ import annotations

import threading
from typing import Any

from llamapy.engine.fake.text import FakeTextModel
from llamapy.runtime import Hosted
from llamapy.server import Server
from llamapy.server.fake import host_fake
from llamapy.server.options import ResolvedStart


def gated_server(gate: threading.Event, *, fail: bool = False, **options: Any) -> Server:
    """A fake server whose load blocks until ``gate`` is set (then fails, with ``fail``)."""
    model = FakeTextModel("gated.gguf")

    def build(start: ResolvedStart) -> Hosted:
        gate.wait()
        if fail:
            raise RuntimeError("the weights are gone")
        return host_fake(start, model)

    return Server.hosting(build, "gated.gguf", **options)


def submitted(server: Server) -> int:
    """How many requests the engine was handed so far."""
    return int(server.stats()["num_submitted"])
