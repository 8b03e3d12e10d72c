"""``POST /v1/responses/compact`` with the official OpenAI client on the real model: Codex's
compaction (``client.responses.compact``) returns a ``CompactedResponse`` ending in a
``compaction`` item, its summarising run reuses the conversation's KV, and the compacted
history continues with ``client.responses.create``."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from http_helpers import MODEL_ALIAS
from live import LiveApp
from openai.types.responses.compacted_response import CompactedResponse
from openai.types.responses.response_compaction_item import ResponseCompactionItem

from llamapy.openai_api.responses_params import COMPACTION_PREFIX
from llamapy.serve import create_app
from llamapy.serve.routes.responses_compact import compact_router
from llamapy.server import Server

INSTRUCTIONS = "You are a helpful assistant. Answer briefly."
HISTORY: list[Any] = [
    {"role": "user", "content": "My name is Ada and I am writing a tide table program."},
    {"role": "assistant", "content": "Nice to meet you, Ada. What should it do first?"},
    {"role": "user", "content": "Read the tide heights from tides.csv and print the highest."},
]


@pytest.fixture(scope="module")
def compact_client(server: Server) -> Iterator[openai.OpenAI]:
    """The official client on an app of the shared server with the compact routes."""
    app = create_app(server, alias=MODEL_ALIAS)
    app.router.routes[0:0] = compact_router(app.state.llamapy).routes
    with LiveApp(app) as live:
        yield openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0,
                            timeout=300)


def summary_of(item: ResponseCompactionItem) -> str:
    """The summary a compaction item carries."""
    text = item.encrypted_content.removeprefix(COMPACTION_PREFIX)
    decoded = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    return str(decoded["summary"])


def test_codex_compacts_then_continues_from_the_summary(compact_client: openai.OpenAI) -> None:
    turn = compact_client.responses.create(
        model=MODEL_ALIAS, input=HISTORY, instructions=INSTRUCTIONS, temperature=0,
        max_output_tokens=24, prompt_cache_key="ada")
    history = [*HISTORY, *(item.model_dump(warnings=False) for item in turn.output)]
    compacted = compact_client.responses.compact(
        model=MODEL_ALIAS, input=history, instructions=INSTRUCTIONS, prompt_cache_key="ada")
    assert isinstance(compacted, CompactedResponse)
    assert compacted.object == "response.compaction" and compacted.id.startswith("resp_")
    *users, last = compacted.output
    assert isinstance(last, ResponseCompactionItem) and last.type == "compaction"
    assert last.encrypted_content.startswith(COMPACTION_PREFIX) and summary_of(last).strip()
    assert [message.role for message in users] == ["user", "user"]  # type: ignore[union-attr]
    usage = compacted.usage
    assert usage.input_tokens_details.cached_tokens >= turn.usage.input_tokens - 1
    assert usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    nxt = compact_client.responses.create(
        model=MODEL_ALIAS, instructions=INSTRUCTIONS, temperature=0, max_output_tokens=16,
        input=[*(item.model_dump(warnings=False) for item in compacted.output),
               {"role": "user", "content": "What is my name?"}])
    assert nxt.status in ("completed", "incomplete") and nxt.output_text
    assert nxt.usage.input_tokens > len(users)
