"""Helpers shared by the HTTP tests (plain module: tests import it by name)."""

from __future__ import annotations

import time

import httpx

MODEL_ALIAS = "smol"
#: Bounded waits in tests, seconds.
WAIT_S = 30.0


def wait_slots_free(http: httpx.Client, timeout: float = WAIT_S) -> list[dict]:
    """Poll ``/slots`` until no slot is processing; return the slots."""
    deadline = time.monotonic() + timeout
    while True:
        slots = http.get("/slots").json()
        if not any(slot["is_processing"] for slot in slots):
            return slots
        assert time.monotonic() < deadline, slots
        time.sleep(0.05)


def chat(content: str, **fields: object) -> dict:
    """A chat request body with one user message, greedy and short by default."""
    return {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": content}],
            "temperature": 0, "max_tokens": 16, **fields}
