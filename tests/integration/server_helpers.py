"""Helpers shared by the real-model server tests."""

from __future__ import annotations

import time

from llamapy.server import Server


def chat(server: Server, text: str) -> str:
    """A ChatML prompt for SmolLM2."""
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def wait_idle(server: Server, timeout: float = 10.0) -> dict:
    """The server's stats once no slot runs and nothing is queued (``AssertionError`` past
    ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = server.stats()
        if stats["slots_active"] == 0 and stats["queue_depth"] == 0:
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.02)
