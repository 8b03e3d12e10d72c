"""Anthropic prompt caching on the real model with the official client: a ``cache_control``
breakpoint on a long system prompt is written once (``cache_creation_input_tokens``), kept
through other conversations that evict the RAM cache's least recently used entries, and read by
the next conversation sharing it (``cache_read_input_tokens``); bad controls are 400s in
Anthropic's shape.

A server of its own: one thread, two slots and a RAM prompt cache of 24 MB (SmolLM2-135M holds
about 23 KB a token, so the cache holds about a thousand tokens and pins about half of that).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from http_helpers import MODEL_ALIAS
from live import LiveApp

from llamapy.serve import create_app
from llamapy.server import Server

GREEDY = {"temperature": 0}
#: About 370 tokens of stable instructions.
SYSTEM = " ".join(f"Rule {i}: answer in plain words, cite rule {i} when it applies." for i
                  in range(1, 21))
EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture(scope="module")
def cached(model_path: Path) -> Iterator[tuple[Server, anthropic.Anthropic]]:
    with Server(model_path, n_ctx=4096, n_parallel=2, n_batch=512, chunk_size=256,
                n_threads=1, prompt_cache_ram_mb=24) as server:
        server.wait_ready(60)
        with LiveApp(create_app(server, alias=MODEL_ALIAS)) as live:
            yield server, anthropic.Anthropic(base_url=live.url, api_key="unused",
                                              max_retries=0, timeout=120)


def ask(claude: anthropic.Anthropic, user: str, **fields: object) -> anthropic.types.Message:
    return claude.messages.create(model=MODEL_ALIAS, max_tokens=2, extra_body=GREEDY,
                                  messages=[{"role": "user", "content": user}], **fields)


def pinned_system(ttl: str = "5m") -> list[dict]:
    return [{"type": "text", "text": SYSTEM, "cache_control": {**EPHEMERAL, "ttl": ttl}}]


def total(usage: anthropic.types.Usage) -> int:
    return (usage.input_tokens + (usage.cache_creation_input_tokens or 0)
            + (usage.cache_read_input_tokens or 0))


def test_a_pinned_system_prompt_is_written_once_and_read_after_eviction_pressure(
        cached: tuple[Server, anthropic.Anthropic]) -> None:
    server, claude = cached
    first = ask(claude, "What is rule 3 about?", system=pinned_system())
    written = first.usage.cache_creation_input_tokens or 0
    assert first.usage.cache_read_input_tokens == 0
    assert 250 < written < total(first.usage)
    for i in range(6):  # other conversations: about 150 tokens each, unpinned
        ask(claude, f"Conversation {i}: " + " ".join(f"word{i}x{j}" for j in range(60)))
    stats = server.stats()
    assert stats["ram_cache_evictions"] > 0 and stats["ram_cache_pinned_bytes"] > 0
    second = ask(claude, "And what does rule 7 say?", system=pinned_system("1h"))
    assert second.usage.cache_read_input_tokens == written
    assert second.usage.cache_creation_input_tokens == 0
    with claude.messages.stream(model=MODEL_ALIAS, max_tokens=2, extra_body=GREEDY,
                                system=pinned_system(), messages=[{"role": "user", "content": [
                                    {"type": "text", "text": "Rule 9, please.",
                                     "cache_control": EPHEMERAL}]}]) as stream:
        final = stream.get_final_message()
    assert final.usage.cache_read_input_tokens >= written  # the system prompt (at least), read
    assert (final.usage.cache_creation_input_tokens or 0) > 0  # the user turn's prefix, written


@pytest.mark.parametrize("control", [{"type": "ephemeral", "ttl": "2h"}, {"type": "bogus"}])
def test_bad_cache_control_is_a_400_in_anthropics_shape(
        cached: tuple[Server, anthropic.Anthropic], control: dict) -> None:
    _, claude = cached
    system = [{"type": "text", "text": "Be brief.", "cache_control": control}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        ask(claude, "hi", system=system)
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "cache_control" in body["error"]["message"]
