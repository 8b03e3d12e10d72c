"""/v1/responses with the official OpenAI client: text and item input, instructions, usage,
incomplete answers, typed streams, forced function calls and their outputs, structured output,
reasoning items, token counts, and errors in the OpenAI shape."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from http_helpers import MODEL_ALIAS

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 20},
               "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
TIME = {"type": "function", "name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}},
    "required": ["zone"]}}
#: Ends the answer at the first full stop, so greedy answers complete quickly.
SENTENCE = {"stop": ["."]}


def respond(client: openai.OpenAI, input: object, **fields: object
            ) -> openai.types.responses.Response:
    """A greedy response (40 tokens unless ``max_output_tokens`` says otherwise)."""
    fields.setdefault("max_output_tokens", 40)
    return client.responses.create(model=MODEL_ALIAS, input=input, temperature=0, **fields)


def test_string_input_with_instructions_equals_the_chat_completion(client: openai.OpenAI
                                                                   ) -> None:
    system = "You are a terse assistant."
    response = respond(client, "Name three colours.", instructions=system,
                       max_output_tokens=20)
    chat = client.chat.completions.create(
        model=MODEL_ALIAS, temperature=0, max_tokens=20,
        messages=[{"role": "system", "content": system},
                  {"role": "user", "content": "Name three colours."}])
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.model == MODEL_ALIAS and response.instructions == system
    assert [item.type for item in response.output] == ["message"]
    assert response.output[0].id.startswith("msg_")
    assert response.output_text == chat.choices[0].message.content
    usage = response.usage
    assert usage.input_tokens == chat.usage.prompt_tokens
    assert usage.output_tokens == chat.usage.completion_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    truncated = chat.choices[0].finish_reason == "length"
    assert response.status == ("incomplete" if truncated else "completed")


def test_item_input_equals_the_chat_messages(client: openai.OpenAI, http: httpx.Client) -> None:
    items = [
        {"role": "developer", "content": "Answer in one word."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "A colour?"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Red.", "annotations": []}]},
        {"role": "user", "content": "Another one?"},
    ]
    messages = [{"role": "system", "content": "Answer in one word."},
                {"role": "user", "content": "A colour?"},
                {"role": "assistant", "content": "Red."},
                {"role": "user", "content": "Another one?"}]
    response = respond(client, items, extra_body=SENTENCE)
    chat = client.chat.completions.create(model=MODEL_ALIAS, messages=messages, temperature=0,
                                          max_tokens=40, stop=["."])
    assert response.status == "completed" and response.incomplete_details is None
    assert response.output_text == chat.choices[0].message.content
    counted = client.responses.input_tokens.count(model=MODEL_ALIAS, input=items)
    assert counted.object == "response.input_tokens"
    chat_count = http.post("/v1/chat/completions/input_tokens",
                           json={"messages": messages}).json()
    assert counted.input_tokens == chat_count["input_tokens"] == response.usage.input_tokens
    assert chat_count["input_tokens"] == chat.usage.prompt_tokens


def test_max_output_tokens_makes_it_incomplete(client: openai.OpenAI) -> None:
    response = respond(client, "Tell me a long story.", max_output_tokens=5)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 5
    assert response.output[0].status == "incomplete"


def test_stream_deltas_add_up_to_the_response(client: openai.OpenAI) -> None:
    full = respond(client, "Say hello.", extra_body=SENTENCE)
    text, numbers, added = "", [], {}
    with client.responses.stream(model=MODEL_ALIAS, input="Say hello.", temperature=0,
                                 max_output_tokens=40, extra_body=SENTENCE) as stream:
        for event in stream:
            numbers.append(event.sequence_number)
            if event.type == "response.output_item.added":
                added[event.output_index] = event.item.id
            if event.type == "response.output_text.delta":
                assert added[event.output_index] == event.item_id
                assert event.content_index == 0
                text += event.delta
        final = stream.get_final_response()
    assert numbers == list(range(len(numbers)))
    assert full.status == final.status == "completed"
    assert text == final.output_text == full.output_text
    assert [item.type for item in final.output] == [item.type for item in full.output]
    assert final.usage.output_tokens == full.usage.output_tokens
    assert final.usage.input_tokens == full.usage.input_tokens
    assert final.usage.input_tokens_details.cached_tokens == full.usage.input_tokens - 1


def test_raw_stream_event_order(http: httpx.Client) -> None:
    body = {"model": MODEL_ALIAS, "input": "Say hello.", "max_output_tokens": 4,
            "temperature": 0, "stream": True}
    with http.stream("POST", "/v1/responses", json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines[0::2]]
    events = [json.loads(line.removeprefix("data: ")) for line in lines[1::2]]
    assert names == [event["type"] for event in events]
    assert names[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert events[-1]["response"]["usage"]["output_tokens"] == 4


def test_forced_function_call(client: openai.OpenAI) -> None:
    response = respond(client, "What is the weather in Paris?", max_output_tokens=60,
                       tools=[WEATHER, TIME],
                       tool_choice={"type": "function", "name": "get_weather"})
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    assert response.status == "completed"


def test_forced_function_call_streams_its_arguments(client: openai.OpenAI) -> None:
    deltas, done = "", None
    with client.responses.stream(model=MODEL_ALIAS, input="What time is it in Tokyo?",
                                 temperature=0, max_output_tokens=60, tools=[WEATHER, TIME],
                                 tool_choice="required") as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                deltas += event.delta
            if event.type == "response.function_call_arguments.done":
                done = event.arguments
        final = stream.get_final_response()
    call = final.output[0]
    assert call.type == "function_call" and deltas == done == call.arguments
    schema = {tool["name"]: tool["parameters"] for tool in (WEATHER, TIME)}
    jsonschema.validate(json.loads(call.arguments), schema[call.name])


def call_turns(city: str, output: str) -> list:
    return [
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": json.dumps({"city": city, "unit": "celsius"})},
        {"type": "function_call_output", "call_id": "call_1", "output": output},
    ]


def test_function_call_output_round_trip(client: openai.OpenAI) -> None:
    response = respond(client, call_turns("Oslo", '{"temperature": -3}'), tools=[WEATHER],
                       max_output_tokens=12)
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text

    def tokens(city: str, output: str) -> int:
        return client.responses.input_tokens.count(
            model=MODEL_ALIAS, input=call_turns(city, output), tools=[WEATHER]).input_tokens

    # the call and its output reach the prompt even though SmolLM2's template shows neither
    base = tokens("Oslo", '{"temperature": -3}')
    assert base == response.usage.input_tokens
    assert tokens("Oslo, Norway", '{"temperature": -3}') > base
    assert tokens("Oslo", '{"temperature": -3, "wind": "strong"}') > base


def test_json_schema_text_format(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"], "additionalProperties": False}
    response = respond(client, "Describe a person as JSON.", max_output_tokens=60,
                       text={"format": {"type": "json_schema", "name": "person",
                                        "schema": schema, "strict": True}})
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text.format.type == "json_schema"


def test_reasoning_items(thinking_client: openai.OpenAI) -> None:
    client = thinking_client  # its template shows reasoning
    grammar = r'root ::= "<think>\nI should greet.\n</think>\n\n" "Hello" [a-z !.]{0,12}'
    fields = {"model": MODEL_ALIAS, "input": "Greet me.", "temperature": 0,
              "max_output_tokens": 30, "reasoning": {"effort": "low"},
              "include": ["reasoning.encrypted_content"], "extra_body": {"grammar": grammar}}
    response = client.responses.create(**fields)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    reasoning = response.output[0]
    assert reasoning.id.startswith("rs_") and reasoning.content[0].text.strip() == "I should greet."
    assert reasoning.encrypted_content and response.usage.output_tokens_details.reasoning_tokens
    thought = ""
    with client.responses.stream(**fields) as stream:
        for event in stream:
            if event.type == "response.reasoning_text.delta":
                thought += event.delta
        final = stream.get_final_response()
    assert thought == reasoning.content[0].text and final.output_text == response.output_text
    # a reasoning item sent back is rendered into the prompt
    history = [{"role": "user", "content": "Greet me."},
               reasoning.model_dump(exclude_none=True),
               {"type": "message", "role": "assistant", "content": response.output_text},
               {"role": "user", "content": "Again?"}]
    without = [history[0], *history[2:]]
    count = client.responses.input_tokens.count
    assert (count(model=MODEL_ALIAS, input=history).input_tokens
            > count(model=MODEL_ALIAS, input=without).input_tokens)


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"input": 42}, 400, "input"),
    ({"input": "hi", "temprature": 0}, 400, "temprature"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, 400, "input_image"),
    ({"input": "hi", "previous_response_id": "resp_1"}, 404, "previous_response_id"),
    ({"input": "hi", "tools": [{"type": "custom", "name": "apply_patch"}]}, 400, "custom"),
    ({"input": "hi", "tools": [WEATHER],
      "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, 400,
     "allowed_tools"),
    ({"input": "hi", "model": "gpt-9"}, 404, None),
])
def test_bad_requests_answer_in_the_openai_shape(http: httpx.Client, client: openai.OpenAI,
                                                 body: dict, status: int,
                                                 param: str | None) -> None:
    response = http.post("/v1/responses", json={"max_output_tokens": 2, **body})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    streamed = http.post("/v1/responses", json={"max_output_tokens": 2, "stream": True, **body})
    assert streamed.status_code == status  # refused before the stream starts
    assert respond(client, "hi", max_output_tokens=2).usage.output_tokens == 2


def test_client_errors_are_typed(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-9", input="hi", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_tokens.count(model=MODEL_ALIAS, input="hi",
                                            previous_response_id="resp_1")
    assert respond(client, "hi", max_output_tokens=2).output
