"""Helpers shared by the HTTP tests (plain module: tests import it by name)."""

from __future__ import annotations

import socket
import time

import httpx

MODEL_ALIAS = "smol"
#: SmolLM2's ChatML with reasoning shown and ``enable_thinking`` read, as thinking families'
#: templates are: llama.cpp's chat layer then reads ``<think>`` blocks as reasoning.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and "
    "m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}")
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
