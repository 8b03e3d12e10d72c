"""The Responses WebSocket on the real model with the official client: a socket's second turn,
sent as ``previous_response_id`` and its new input only (``store: false``), renders as the
whole conversation would and reuses the first turn's KV."""

from __future__ import annotations

from typing import Any

import httpx
import openai
from http_helpers import MODEL_ALIAS, wait_slots_free

FINAL = ("response.completed", "response.incomplete", "error")
SETTINGS: dict[str, Any] = {"model": MODEL_ALIAS, "store": False, "max_output_tokens": 12,
                            "temperature": 0}


def final_event(conn: Any) -> Any:
    for event in conn:
        if event.type in FINAL:
            assert event.type != "error", event
            return event.response
    raise AssertionError("the socket closed before the response ended")


def test_a_socket_continues_its_own_response_on_its_kv(client: openai.OpenAI,
                                                       http: httpx.Client) -> None:
    with client.responses.connect() as conn:
        conn.response.create(input="Name three primary colors.", **SETTINGS)
        first = final_event(conn)
        conn.response.create(input="Now name one more.", previous_response_id=first.id,
                             **SETTINGS)
        second = final_event(conn)
    assert second.previous_response_id == first.id and second.output
    whole = client.responses.create(input=[
        {"role": "user", "content": "Name three primary colors."},
        *(item.model_dump(exclude_none=True) for item in first.output),
        {"role": "user", "content": "Now name one more."}], **{**SETTINGS,
                                                              "max_output_tokens": 1})
    assert second.usage is not None and first.usage is not None and whole.usage is not None
    assert second.usage.input_tokens == whole.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens >= 0.8 * first.usage.input_tokens
    wait_slots_free(http)


AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agent tools.",
          "tools": [{"type": "function", "name": "close_agent", "description": "Close an agent.",
                     "parameters": {"type": "object",
                                    "properties": {"target": {"type": "string"}}}}]}


def test_codex_s_compaction_trigger_compacts_the_socket_s_conversation(
        client: openai.OpenAI, http: httpx.Client) -> None:
    """As Codex 0.171 compacts: the socket's last response continued by an input of one
    ``compaction_trigger``, with its namespace and hosted tools offered; the answer is one
    ``compaction`` item, its summary written on the conversation's cached KV, and the next turn
    goes on from it."""
    tools = [AGENTS, {"type": "web_search", "external_web_access": False}]
    with client.responses.connect() as conn:
        conn.response.create(input="My name is Ada. I am writing a tide table program.",
                             tools=tools, **SETTINGS)  # type: ignore[arg-type]
        first = final_event(conn)
        conn.response.create(input=[{"type": "compaction_trigger"}],  # type: ignore[list-item]
                             previous_response_id=first.id, tools=tools,  # type: ignore[arg-type]
                             **SETTINGS)
        compacted = final_event(conn)
        assert [item.type for item in compacted.output] == ["compaction"]
        assert compacted.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1
        conn.response.create(input=[*(item.model_dump(exclude_none=True)
                                      for item in compacted.output),
                                    {"role": "user", "content": "What is my name?"}],
                             tools=tools, **SETTINGS)  # type: ignore[arg-type]
        after = final_event(conn)
    assert after.status in ("completed", "incomplete") and after.output
    wait_slots_free(http)
