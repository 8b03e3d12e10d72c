"""Stored responses and conversations on the real model, driven by the official OpenAI client:
``store``, ``previous_response_id`` (the client sends only the new input; the server computes
only the new tokens), ``retrieve``, ``input_items.list``, ``delete``, and ``conversations``
with their items."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from http_helpers import MODEL_ALIAS, wait_slots_free


def respond(client: openai.OpenAI, input: object, **fields: object
            ) -> openai.types.responses.Response:
    return client.responses.create(model=MODEL_ALIAS, input=input, temperature=0,
                                   max_output_tokens=12, **fields)


def test_a_conversation_by_previous_response_id_sends_and_computes_only_its_new_turns(
        client: openai.OpenAI) -> None:
    system = "You are a terse assistant. Answer in one short sentence."
    first = respond(client, "Name a colour.", instructions=system)
    history: list[object] = [{"role": "user", "content": "Name a colour."},
                             *(item.model_dump() for item in first.output)]
    previous = first
    for question in ("Name a fruit.", "Name a city.", "Name a tree."):
        turn = respond(client, question, instructions=system, previous_response_id=previous.id)
        history.append({"role": "user", "content": question})
        resent = respond(client, history, instructions=system, store=False)
        assert turn.previous_response_id == previous.id and turn.store is True
        assert turn.usage.input_tokens == resent.usage.input_tokens
        assert turn.output_text == resent.output_text  # greedy: the same conversation
        cached = turn.usage.input_tokens_details.cached_tokens
        assert cached >= previous.usage.input_tokens - 4  # all but a re-rendered header
        history += [item.model_dump() for item in turn.output]
        previous = turn
    got = client.responses.retrieve(previous.id)
    assert got.id == previous.id and got.output_text == previous.output_text
    items = list(client.responses.input_items.list(previous.id, order="asc", limit=1))
    assert [item.content[0].text for item in items] == ["Name a tree."]
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    assert respond(client, "Name a bird.", previous_response_id=previous.id).output_text


def test_conversations_with_the_official_client(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(
        items=[{"role": "user", "content": "My name is Ada."}], metadata={"app": "test"})
    answer = respond(client, "What is my name?", conversation=conversation.id)
    assert answer.conversation is not None and answer.conversation.id == conversation.id
    listed = client.conversations.items.list(conversation.id, order="asc")
    assert len(listed.data) == 2 + len(answer.output)
    client.conversations.items.create(conversation.id,
                                      items=[{"role": "user", "content": "Thanks."}])
    first_id = listed.data[0].id
    assert client.conversations.items.retrieve(first_id,
                                               conversation_id=conversation.id).id == first_id
    client.conversations.items.delete(first_id, conversation_id=conversation.id)
    updated = client.conversations.update(conversation.id, metadata={"app": "renamed"})
    assert updated.metadata == {"app": "renamed"}
    assert client.conversations.retrieve(conversation.id).id == conversation.id
    assert client.conversations.delete(conversation.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)


def test_a_background_response_with_the_official_client(client: openai.OpenAI,
                                                        http: httpx.Client) -> None:
    """``background=True``: queued at once, ``retrieve`` polls it to the answer the same
    request gives in the foreground; a long one is ``cancel``led and its slot freed."""
    queued = respond(client, "Name a colour.", background=True)
    assert queued.status == "queued" and queued.background is True
    deadline = time.monotonic() + 120
    while (polled := client.responses.retrieve(queued.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert polled.status in ("completed", "incomplete")
    assert polled.output_text == respond(client, "Name a colour.", store=False).output_text
    long = client.responses.create(model=MODEL_ALIAS, input="Count to a thousand.",
                                   background=True, max_output_tokens=4000,
                                   extra_body={"ignore_eos": True})
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(long.id).status == "cancelled"
    wait_slots_free(http)
