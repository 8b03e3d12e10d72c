"""Helpers shared by the HTTP tests (plain module: tests import it by name)."""

from __future__ import annotations

import socket
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


def poll(http: httpx.Client, path: str, status: int) -> httpx.Response:
    """GET ``path`` until it answers ``status`` (bounded)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            response = http.get(path)
            if response.status_code == status:
                return response
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{path} never answered {status}"
        time.sleep(0.05)


def free_port() -> int:
    """A port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
