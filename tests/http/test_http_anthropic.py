"""/v1/messages with the official Anthropic client: text, streams, system prompts, stop
sequences, tools (forced and in history), thinking, count_tokens, errors in Anthropic's shape.

The SDK no longer takes ``temperature`` as a keyword, so it travels in ``extra_body``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import jsonschema
import openai
import pytest
from http_helpers import MODEL_ALIAS
from live import LiveApp

from llamapy.serve import create_app
from llamapy.server import Server

GREEDY = {"temperature": 0}
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 20},
               "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
TIME = {"name": "get_time", "input_schema": {"type": "object", "properties": {
    "zone": {"type": "string", "maxLength": 10}}, "required": ["zone"]}}
COLOURS = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def claude(live: LiveApp) -> anthropic.Anthropic:
    """The official Anthropic client on the live app."""
    return anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0, timeout=120)


def ask(claude: anthropic.Anthropic, messages: list, **fields: object) -> anthropic.types.Message:
    """A greedy message (24 tokens unless ``max_tokens`` says otherwise)."""
    fields.setdefault("max_tokens", 24)
    return claude.messages.create(model=MODEL_ALIAS, messages=messages, extra_body=GREEDY,
                                  **fields)


def count(claude: anthropic.Anthropic, messages: list, **fields: object) -> int:
    return claude.messages.count_tokens(model=MODEL_ALIAS, messages=messages,
                                        **fields).input_tokens


def blocks(message: anthropic.types.Message) -> list[dict]:
    """The content blocks as dicts (a stream's final message has parsed block types)."""
    return [block.model_dump(exclude={"parsed_output"}) for block in message.content]


def prompt_tokens(message: anthropic.types.Message) -> int:
    usage = message.usage
    return (usage.input_tokens + (usage.cache_read_input_tokens or 0)
            + (usage.cache_creation_input_tokens or 0))


def test_message_equals_the_chat_completion(claude: anthropic.Anthropic,
                                            client: openai.OpenAI) -> None:
    message = ask(claude, COLOURS, max_tokens=20)
    chat = client.chat.completions.create(model=MODEL_ALIAS, messages=COLOURS, temperature=0,
                                          max_tokens=20)
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.role == "assistant" and message.model == MODEL_ALIAS
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == chat.choices[0].message.content
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    assert message.usage.output_tokens == 20
    assert prompt_tokens(message) == chat.usage.prompt_tokens
    again = ask(claude, COLOURS, max_tokens=20)  # the same prompt again: all of it reused
    assert again.content == message.content
    assert again.usage.cache_read_input_tokens == chat.usage.prompt_tokens - 1
    assert again.usage.input_tokens == 1


def test_stream_final_message_equals_the_message(claude: anthropic.Anthropic) -> None:
    full = ask(claude, COLOURS)
    kinds, text = [], ""
    with claude.messages.stream(model=MODEL_ALIAS, messages=COLOURS, max_tokens=24,
                                extra_body=GREEDY) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds[1] == "content_block_start" and "message_delta" in kinds
    assert text == full.content[0].text
    assert blocks(final) == blocks(full)
    assert (final.stop_reason, final.stop_sequence) == (full.stop_reason, full.stop_sequence)
    assert final.usage.output_tokens == full.usage.output_tokens
    assert prompt_tokens(final) == prompt_tokens(full)


def test_raw_stream_names_every_event_and_counts_blocks(http: httpx.Client) -> None:
    body = {"model": MODEL_ALIAS, "max_tokens": 8, "stream": True, "temperature": 0,
            "messages": COLOURS}
    with http.stream("POST", "/v1/messages", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines[0::2]]
    events = [json.loads(line.removeprefix("data: ")) for line in lines[1::2]]
    assert names == [event["type"] for event in events]
    assert events[0]["message"]["content"] == [] and events[0]["message"]["usage"]
    assert {event["index"] for event in events if "index" in event} == {0}
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2]["usage"]["output_tokens"] == 8


def test_system_prompt_is_the_chat_system_message(claude: anthropic.Anthropic,
                                                  http: httpx.Client) -> None:
    system = "You are a pirate. Answer like one."
    blocks = [{"type": "text", "text": "You are a pirate."},
              {"type": "text", "text": "Answer like one.", "cache_control": {"type": "ephemeral"}}]
    chat = {"messages": [{"role": "system", "content": system}, *COLOURS]}
    chat_tokens = http.post("/v1/chat/completions/input_tokens", json=chat).json()
    assert count(claude, COLOURS, system=system) == chat_tokens["input_tokens"]
    assert count(claude, COLOURS, system=system + " Be brief.") > count(claude, COLOURS,
                                                                         system=system)
    assert count(claude, COLOURS, system=blocks) == count(claude, COLOURS,
                                                          system=system.replace(". ", ".\n"))
    assert ask(claude, COLOURS, system=system).content[0].text


def test_stop_sequence(claude: anthropic.Anthropic) -> None:
    text = ask(claude, COLOURS, max_tokens=30).content[0].text
    word = text.split()[2]
    stop = " " + word
    message = ask(claude, COLOURS, max_tokens=30, stop_sequences=[stop, "\u00a7"])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert message.content[0].text == text[:text.index(stop)]


def test_max_tokens_stop_reason(claude: anthropic.Anthropic) -> None:
    message = ask(claude, COLOURS, max_tokens=3)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3


def test_forced_tool_use_validates(claude: anthropic.Anthropic) -> None:
    message = ask(claude, [{"role": "user", "content": "What is the weather in Paris?"}],
                  max_tokens=60, tools=[WEATHER, TIME],
                  tool_choice={"type": "tool", "name": "get_weather"})
    assert message.stop_reason == "tool_use"
    calls = [block for block in message.content if block.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert calls[0].id.startswith("toolu_")
    jsonschema.validate(calls[0].input, WEATHER["input_schema"])


def test_forced_tool_use_streams_input_json(claude: anthropic.Anthropic) -> None:
    partial, starts = "", []
    with claude.messages.stream(
            model=MODEL_ALIAS, max_tokens=60, extra_body=GREEDY, tools=[WEATHER, TIME],
            tool_choice={"type": "any"},
            messages=[{"role": "user", "content": "What time is it in Tokyo?"}]) as stream:
        for event in stream:
            if event.type == "content_block_start":
                starts.append(event.content_block.type)
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial += event.delta.partial_json
        final = stream.get_final_message()
    assert starts == ["tool_use"] and final.stop_reason == "tool_use"
    call = final.content[0]
    schema = {tool["name"]: tool["input_schema"] for tool in (WEATHER, TIME)}
    jsonschema.validate(json.loads(partial), schema[call.name])
    assert call.input == json.loads(partial)


def tool_turns(city: str, result: str | list, is_error: bool = False) -> list:
    return [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": city, "unit": "celsius"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": result,
             "is_error": is_error}]},
    ]


def test_tool_result_round_trip(claude: anthropic.Anthropic) -> None:
    # (tool_choice none: whether SmolLM2 calls again is a near tie that the KV reused from
    # earlier tests can tip; the round trip is what is checked here)
    message = ask(claude, tool_turns("Oslo", "-3 degrees"), tools=[WEATHER], max_tokens=12,
                  tool_choice={"type": "none"})
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert [block.type for block in message.content] == ["text"]
    # the call and its result reach the prompt even though SmolLM2's template shows neither
    base = count(claude, tool_turns("Oslo", "-3 degrees"), tools=[WEATHER])
    assert count(claude, tool_turns("Oslo, Norway", "-3 degrees"), tools=[WEATHER]) > base
    longer = [{"type": "text", "text": "-3 degrees"}, {"type": "text", "text": "snow at noon"}]
    assert count(claude, tool_turns("Oslo", longer), tools=[WEATHER]) > base
    assert count(claude, tool_turns("Oslo", "-3 degrees", is_error=True), tools=[WEATHER]) > base


def test_thinking_enabled_and_rendered_back(claude: anthropic.Anthropic) -> None:
    thinking = {"type": "enabled", "budget_tokens": 1024}
    message = ask(claude, COLOURS, max_tokens=16, thinking=thinking)
    assert message.content and message.stop_reason in ("end_turn", "max_tokens")

    def history(blocks: list) -> list:
        return [*COLOURS, {"role": "assistant", "content": blocks},
                {"role": "user", "content": "And two more?"}]

    answer = {"type": "text", "text": "Red, green and blue."}
    thought = {"type": "thinking", "thinking": "The user wants colours.", "signature": "sig"}
    assert count(claude, history([thought, answer])) > count(claude, history([answer]))


def test_thinking_blocks_from_parsed_reasoning(thinking: LiveApp) -> None:
    # the grammar makes even a small model think first, so the parser's split is observable
    # (the template shows reasoning, so its format reads it: see the thinking fixture)
    claude = anthropic.Anthropic(base_url=thinking.url, api_key="unused", max_retries=0)
    grammar = r'root ::= "<think>\nI should greet.\n</think>\n\n" "Hello" [a-z !.]{0,12}'
    fields = {"messages": [{"role": "user", "content": "Greet me."}], "max_tokens": 30,
              "extra_body": {**GREEDY, "grammar": grammar}, "model": MODEL_ALIAS}
    message = claude.messages.create(**fields)
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking.strip() == "I should greet." and message.content[0].signature
    assert message.content[1].text.startswith("Hello")
    deltas = []
    with claude.messages.stream(**fields) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                deltas.append((event.index, event.delta.type))
        final = stream.get_final_message()
    assert blocks(final) == blocks(message)
    assert (0, "signature_delta") in deltas and (1, "text_delta") in deltas
    assert deltas.index((0, "signature_delta")) < deltas.index((1, "text_delta"))


def test_count_tokens_equals_the_prompt_usage(claude: anthropic.Anthropic) -> None:
    messages = [{"role": "user", "content": "Count the planets of the solar system."}]
    tokens = count(claude, messages, system="Be brief.", tools=[WEATHER])
    message = ask(claude, messages, system="Be brief.", tools=[WEATHER], max_tokens=4)
    assert tokens == prompt_tokens(message)
    assert message.usage.cache_creation_input_tokens == 0


def test_metadata_user_id_keeps_the_conversation_on_its_slot(claude: anthropic.Anthropic
                                                             ) -> None:
    metadata = {"user_id": "user-42"}
    first = ask(claude, COLOURS, max_tokens=8, metadata=metadata)
    turns = [*COLOURS, {"role": "assistant", "content": first.content[0].text},
             {"role": "user", "content": "One more?"}]
    second = ask(claude, turns, max_tokens=4, metadata=metadata)
    assert second.usage.cache_read_input_tokens >= prompt_tokens(first) - 1


def error_body(exc: anthropic.APIStatusError, kind: str) -> str:
    body = exc.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]["message"]


def test_missing_max_tokens_is_a_bad_request(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.post("/v1/messages", cast_to=httpx.Response,
                    body={"model": MODEL_ALIAS, "messages": COLOURS})
    assert "max_tokens" in error_body(caught.value, "invalid_request_error")
    assert ask(claude, COLOURS, max_tokens=2).usage.output_tokens == 2


@pytest.mark.parametrize("content", [
    [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}],
    [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}],
    [{"type": "tool_use", "id": "t", "name": "x", "input": {}}],
])
def test_unsupported_blocks_are_bad_requests(claude: anthropic.Anthropic, content: list) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        ask(claude, [{"role": "user", "content": content}])
    error_body(caught.value, "invalid_request_error")
    assert ask(claude, COLOURS, max_tokens=2).content


def test_unknown_model_and_fields(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude.messages.create(model="claude-opus-9", max_tokens=4, messages=COLOURS)
    error_body(caught.value, "not_found_error")
    stream = claude.messages.stream(model="claude-opus-9", max_tokens=4, messages=COLOURS)
    with pytest.raises(anthropic.NotFoundError), stream:  # refused before the stream starts
        pass
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model=MODEL_ALIAS, max_tokens=4, messages=COLOURS,
                               extra_body={"temprature": 0})
    assert "temprature" in error_body(bad.value, "invalid_request_error")
    assert ask(claude, COLOURS, max_tokens=2).content


@pytest.fixture(scope="module")
def keyed(server: Server) -> Iterator[LiveApp]:
    """An app on the shared server with an API key."""
    with LiveApp(create_app(server, alias=MODEL_ALIAS, api_key="sekret")) as app:
        yield app


def test_api_key_by_x_api_key_or_bearer(keyed: LiveApp) -> None:
    bad = anthropic.Anthropic(base_url=keyed.url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        bad.messages.create(model=MODEL_ALIAS, max_tokens=2, messages=COLOURS)
    error_body(caught.value, "authentication_error")
    good = anthropic.Anthropic(base_url=keyed.url, api_key="sekret", max_retries=0)
    assert good.messages.count_tokens(model=MODEL_ALIAS, messages=COLOURS).input_tokens > 0
    bearer = anthropic.Anthropic(base_url=keyed.url, auth_token="sekret", max_retries=0)
    assert bearer.messages.create(model=MODEL_ALIAS, max_tokens=2, messages=COLOURS,
                                  extra_headers={"anthropic-version": "2023-06-01"}).content
    with httpx.Client(base_url=keyed.url, timeout=60) as http:  # OpenAI routes: OpenAI shape
        response = http.get("/v1/models", headers={"x-api-key": "nope"})
        assert response.status_code == 401 and response.json()["error"]["code"]
        assert http.get("/v1/models", headers={"x-api-key": "sekret"}).status_code == 200
