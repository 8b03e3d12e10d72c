"""Streaming ``n`` > 1 on ``/v1/chat/completions``: the choices are generated concurrently,
their chunks interleaved with each choice's ``index``, each adding up to what the same choice
gives without streaming, and one usage chunk sums them."""

from __future__ import annotations

import json

import httpx
import openai
from http_helpers import MODEL_ALIAS

from llamapy.openai_api.chat import stream_chat_completion
from llamapy.server import Server

BODY = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "Say a colour."}],
        "max_tokens": 12, "temperature": 0.9, "seed": 11, "n": 3}


def test_streamed_choices_match_the_non_streamed_ones(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(**BODY)  # type: ignore[call-overload]
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    usage = None
    with client.chat.completions.create(**BODY, stream=True,  # type: ignore[call-overload]
                                        stream_options={"include_usage": True}) as stream:
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
                if choice.finish_reason:
                    finishes[choice.index] = choice.finish_reason
    assert sorted(texts) == [0, 1, 2] and sorted(finishes) == [0, 1, 2]
    assert [texts[c.index] for c in plain.choices] == [c.message.content for c in plain.choices]
    assert usage is not None and usage.completion_tokens == plain.usage.completion_tokens
    assert usage.prompt_tokens == plain.usage.prompt_tokens


def test_the_choices_interleave(http: httpx.Client) -> None:
    body = {**BODY, "max_tokens": 24, "temperature": 0, "n": 2, "stream": True, "ignore_eos": True}
    order = []
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                order += [c["index"] for c in json.loads(line[6:])["choices"]]
    first_done = max(i for i, index in enumerate(order) if index == order[0])
    assert set(order) == {0, 1}
    assert any(index != order[0] for index in order[:first_done])  # not one after the other


def test_the_sync_library_stream_yields_every_choice(server: Server) -> None:
    body = {k: v for k, v in BODY.items() if k != "model"}  # the bare server has no alias
    chunks = list(stream_chat_completion(server, {**body, "stream": True,
                                                   "stream_options": {"include_usage": True}}))
    indexes = {c["index"] for chunk in chunks for c in chunk["choices"]}
    assert indexes == {0, 1, 2} and chunks[-1]["choices"] == [] and chunks[-1]["usage"]
