"""/v1/chat/completions with the official OpenAI client: text, streams, usage, cache, tools,
structured output, logprobs, reasoning."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
from http_helpers import MODEL_ALIAS, THINKING_TEMPLATE, chat
from live import LiveApp

from llamapy.serve import create_app
from llamapy.server import Server

SYSTEM = ("You are a terse assistant for a museum of natural history. Answer in one short "
          "sentence. Visitors ask about dinosaurs, minerals, meteorites and the opening hours, "
          "which are nine to five every day except Mondays.")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "maxLength": 10}}, "required": ["zone"]}}}


def test_stream_equals_non_stream_at_temperature_zero(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Name three colours."}]
    full = client.chat.completions.create(model=MODEL_ALIAS, messages=messages,
                                          temperature=0, max_tokens=24)
    stream = client.chat.completions.create(model=MODEL_ALIAS, messages=messages,
                                            temperature=0, max_tokens=24, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and
                c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert full.id.startswith("chatcmpl-") and full.model == MODEL_ALIAS


def test_usage_counts_match_the_tokenizer(http: httpx.Client) -> None:
    body = chat("Count to ten.", max_tokens=5)
    prompt = http.post("/apply-template", json=body).json()["prompt"]
    tokens = http.post("/tokenize", json={"content": prompt, "add_special": True}).json()
    result = http.post("/v1/chat/completions", json=body).json()
    usage = result["usage"]
    assert usage["prompt_tokens"] == len(tokens["tokens"])
    assert result["choices"][0]["finish_reason"] == "length"
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5


def test_cached_tokens_on_a_repeated_prefix(http: httpx.Client, client: openai.OpenAI) -> None:
    def ask(question: str) -> httpx.Response:
        return http.post("/v1/chat/completions", json={
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": question}],
            "temperature": 0, "max_tokens": 4})

    ask("When do you open?")
    second = ask("Do you have meteorites?")
    usage = second.json()["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert 30 < cached < usage["prompt_tokens"]
    assert second.headers["X-Llamapy-Cache-Tokens"] == str(cached)
    assert second.headers["X-Llamapy-Cache-Source"] in ("own", "donor", "ram")
    timings = second.json()["timings"]
    assert timings["cache_diverged_at"] == cached
    assert "meteorites" in timings["cache_diverged_text"] or timings["cache_diverged_text"]
    third = client.chat.completions.create(
        model=MODEL_ALIAS, temperature=0, max_tokens=4,
        messages=[{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": "Do you have meteorites?"}])
    assert third.usage.prompt_tokens_details.cached_tokens == third.usage.prompt_tokens - 1


def test_logprobs(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(
        model=MODEL_ALIAS, messages=[{"role": "user", "content": "Say hello."}],
        temperature=0, max_tokens=6, logprobs=True, top_logprobs=3)
    content = result.choices[0].logprobs.content
    assert len(content) == result.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert entry.token == entry.top_logprobs[0].token  # greedy: the most likely one
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
    stream = client.chat.completions.create(
        model=MODEL_ALIAS, messages=[{"role": "user", "content": "Say hello."}],
        temperature=0, max_tokens=6, logprobs=True, top_logprobs=3, stream=True)
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]


def test_tool_choice_required_gives_a_valid_call(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(
        model=MODEL_ALIAS, temperature=0, max_tokens=60, tools=[WEATHER, TIME],
        tool_choice="required",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function"
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    jsonschema.validate(json.loads(call.function.arguments), schema[call.function.name])


def test_named_tool_choice_streams_call_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL_ALIAS, temperature=0, max_tokens=60, tools=[WEATHER, TIME], stream=True,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        messages=[{"role": "user", "content": "What time is it in Tokyo?"}])
    name, arguments, finish = None, "", None
    for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        for piece in (delta.tool_calls or []) if delta else []:
            assert piece.index == 0
            name = piece.function.name or name
            arguments += piece.function.arguments or ""
        finish = (chunk.choices[0].finish_reason if chunk.choices else None) or finish
    assert name == "get_time" and finish == "tool_calls"
    jsonschema.validate(json.loads(arguments), TIME["function"]["parameters"])


def test_tool_choice_auto_parses_a_call_the_model_writes(client: openai.OpenAI) -> None:
    # a grammar stands for a model that decides to call a tool in its own (Hermes) format
    grammar = (r'root ::= "<tool_call>\n{\"name\": \"get_time\", \"arguments\": '
               r'{\"zone\": \"UTC\"}}\n</tool_call>"')
    result = client.chat.completions.create(
        model=MODEL_ALIAS, temperature=0, max_tokens=40, tools=[WEATHER, TIME],
        tool_choice="auto", extra_body={"grammar": grammar},
        messages=[{"role": "user", "content": "What time is it in UTC?"}])
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    call = choice.message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_time",
                                                                         {"zone": "UTC"})


def test_tool_conversation_round_trip(client: openai.OpenAI) -> None:
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather",
                         "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": -3}'},
    ]
    result = client.chat.completions.create(model=MODEL_ALIAS, messages=messages,
                                            tools=[WEATHER], tool_choice="none",
                                            temperature=0, max_tokens=8)
    assert result.choices[0].message.tool_calls is None
    assert result.choices[0].finish_reason in ("stop", "length")


def test_json_schema_response_validates(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                 "maxItems": 2}},
        "required": ["name", "age", "tags"], "additionalProperties": False}
    result = client.chat.completions.create(
        model=MODEL_ALIAS, temperature=0, max_tokens=80,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": schema}})
    assert result.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(result.choices[0].message.content), schema)


def test_json_object_response(http: httpx.Client) -> None:
    body = chat("Give me a JSON object about a cat.", max_tokens=60,
                response_format={"type": "json_object"})
    result = http.post("/v1/chat/completions", json=body).json()
    content = result["choices"][0]["message"]["content"]
    if result["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(content), dict)
    else:
        assert content.lstrip().startswith("{")


def test_reasoning_is_split_from_the_answer(thinking_client: openai.OpenAI) -> None:
    client = thinking_client  # its template shows reasoning
    # the grammar makes even a small model think first, so the parser's split is observable
    grammar = r'root ::= "<think>\nI should greet.\n</think>\n\n" "Hello" [a-z !.]{0,12}'
    messages = [{"role": "user", "content": "Greet me."}]
    result = client.chat.completions.create(model=MODEL_ALIAS, messages=messages,
                                            temperature=0, max_tokens=30,
                                            extra_body={"grammar": grammar})
    message = result.choices[0].message
    assert message.model_extra["reasoning_content"].strip() == "I should greet."
    assert message.content.startswith("Hello") and "<think>" not in message.content
    stream = client.chat.completions.create(model=MODEL_ALIAS, messages=messages,
                                            temperature=0, max_tokens=30, stream=True,
                                            extra_body={"grammar": grammar})
    reasoning, content = "", ""
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
    assert (reasoning, content) == (message.model_extra["reasoning_content"], message.content)


def test_stop_sequences_and_content_parts(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(
        model=MODEL_ALIAS, temperature=0, max_tokens=40, stop=[".", "\n"],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Describe the sun"},
                                               {"type": "text", "text": "in two sentences."}]}])
    text = result.choices[0].message.content
    assert "." not in text and "\n" not in text
    assert result.choices[0].finish_reason == "stop"


def test_seed_makes_sampling_reproducible(client: openai.OpenAI) -> None:
    def sample() -> str | None:
        return client.chat.completions.create(
            model=MODEL_ALIAS, temperature=1.0, seed=1234, max_tokens=12,
            messages=[{"role": "user", "content": "Invent a word."}],
            # both runs compute the prompt in one batch: a cached prompt's last token is
            # evaluated alone, with logits a few bits off, which can move a sampled draw
            extra_body={"cache_prompt": False}).choices[0].message.content

    assert sample() == sample()


#: THINKING_TEMPLATE whose generation prompt opens the reasoning block (as Qwen3's and
#: DeepSeek R1's do): the output begins inside it.
OPEN_THINKING = THINKING_TEMPLATE.replace(
    "{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}", "<think>\n")


def test_a_reasoning_budget_forces_the_end_of_the_reasoning(server: Server) -> None:
    """llama-server's ``reasoning_budget_tokens``: past the budget, the format's end tag is
    forced (llama.cpp's own reasoning-budget sampler), so the answer starts."""
    assert OPEN_THINKING != THINKING_TEMPLATE
    grammar = r'root ::= [a-z ]+ "</think>" "\n\nHello" [a-z !.]{0,8}'
    body = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "Greet me."}],
            "temperature": 0, "max_tokens": 60}
    with LiveApp(create_app(server, alias=MODEL_ALIAS, chat_template=OPEN_THINKING)) as app:
        client = openai.OpenAI(base_url=app.url + "/v1", api_key="unused", max_retries=0)
        free = client.chat.completions.create(**body, extra_body={"grammar": grammar})
        bounded = client.chat.completions.create(
            **body, extra_body={"grammar": grammar, "reasoning_budget_tokens": 4})
    long_thought = free.choices[0].message.model_extra.get("reasoning_content") or ""
    short = bounded.choices[0].message
    assert len(long_thought) > 40 and free.choices[0].finish_reason == "length"
    assert 0 < len(short.model_extra["reasoning_content"]) < 40
    assert short.content.startswith("Hello")
