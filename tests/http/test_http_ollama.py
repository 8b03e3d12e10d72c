"""/api/* with the official Ollama client: chat and generate (streamed and not), options,
``format`` schemas, tools in history, ``think``, embeddings, the model endpoints, prefix reuse,
errors in Ollama's shape.

SmolLM2's template shows neither tools nor reasoning: the model never calls a tool on its own
and has no ``thinking`` (the parsing of both is tested on the fake backend,
``tests/http_fake/test_http_ollama_fake.py``).
"""

from __future__ import annotations

import json
from datetime import datetime

import httpx
import jsonschema
import numpy as np
import ollama
import openai
import pytest
from http_helpers import MODEL_ALIAS
from live import LiveApp

GREEDY = {"temperature": 0, "num_predict": 12}
COLOURS = [{"role": "user", "content": "Name three colours."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def llama(live: LiveApp) -> ollama.Client:
    """The official Ollama client on the live app."""
    return ollama.Client(host=live.url, timeout=120)


def test_chat_equals_the_chat_completion_and_its_stream(llama: ollama.Client,
                                                        client: openai.OpenAI) -> None:
    whole = llama.chat(model=MODEL_ALIAS, messages=COLOURS, stream=False, options=GREEDY)
    chat = client.chat.completions.create(model=MODEL_ALIAS, messages=COLOURS, temperature=0,
                                          max_tokens=12)
    assert whole.message.role == "assistant" and whole.model == MODEL_ALIAS
    assert whole.message.content == chat.choices[0].message.content
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 12
    assert whole.total_duration >= whole.eval_duration > 0
    assert datetime.fromisoformat(whole.created_at.replace("Z", "+00:00"))
    parts = list(llama.chat(model=f"{MODEL_ALIAS}:latest", messages=COLOURS, stream=True,
                            options=GREEDY))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].done_reason == "length" and parts[-1].eval_count == 12


def test_generate_system_stream_and_raw(llama: ollama.Client) -> None:
    prompt = "Name three colours."
    whole = llama.generate(model=MODEL_ALIAS, prompt=prompt, options=GREEDY)
    streamed = "".join(p.response for p in llama.generate(model=MODEL_ALIAS, prompt=prompt,
                                                          stream=True, options=GREEDY))
    assert whole.response and streamed == whole.response and whole.done_reason == "length"
    template = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                "Hugging Face<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
                "<|im_start|>assistant\n")
    raw = llama.generate(model=MODEL_ALIAS, prompt=template.format(prompt), raw=True,
                         options=GREEDY)
    assert raw.response == whole.response  # the same prompt, written by hand
    pirate = llama.generate(model=MODEL_ALIAS, prompt=prompt, system="You are a pirate.",
                            options=GREEDY)
    assert pirate.response != whole.response


def test_options_determinism_seed_and_stop(llama: ollama.Client) -> None:
    def text(**options: object) -> str:
        return llama.generate(model=MODEL_ALIAS, prompt="Tell me a story.",
                              options={"num_predict": 16, **options}).response

    assert text(temperature=0) == text(temperature=0)
    assert text(temperature=1.0, seed=42) == text(temperature=1.0, seed=42)
    greedy = text(temperature=0)
    word = " " + greedy.split()[3]
    stopped = llama.generate(model=MODEL_ALIAS, prompt="Tell me a story.",
                             options={"num_predict": 16, "temperature": 0, "stop": [word]})
    assert stopped.done_reason == "stop" and stopped.response == greedy[:greedy.index(word)]


def test_format_schema_and_json(llama: ollama.Client) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
              "required": ["colour"], "additionalProperties": False}
    answer = llama.chat(model=MODEL_ALIAS, messages=COLOURS, format=schema,
                        options={"temperature": 0, "num_predict": 40})
    jsonschema.validate(json.loads(answer.message.content), schema)
    any_json = llama.generate(model=MODEL_ALIAS, prompt="A JSON list of two colours.",
                              format="json", options={"temperature": 0, "num_predict": 40})
    assert any_json.done_reason == "length" or json.loads(any_json.response) is not None


def test_tools_and_a_tool_result_in_history(llama: ollama.Client) -> None:
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "-3 degrees and snow"},
    ]
    answer = llama.chat(model=MODEL_ALIAS, messages=messages, tools=[WEATHER],
                        options=GREEDY)
    assert answer.done and answer.message.content
    for call in answer.message.tool_calls or []:  # SmolLM2 rarely calls one
        assert isinstance(call.function.arguments, dict)


def test_think_is_accepted_without_a_reasoning_template(llama: ollama.Client) -> None:
    assert "thinking" not in (llama.show(MODEL_ALIAS).capabilities or [])
    for think in (True, False, "high"):
        answer = llama.chat(model=MODEL_ALIAS, messages=COLOURS, think=think,
                            options={"temperature": 0, "num_predict": 4})
        assert answer.message.thinking is None and answer.message.content


def test_logprobs(llama: ollama.Client) -> None:
    answer = llama.chat(model=MODEL_ALIAS, messages=COLOURS, logprobs=True, top_logprobs=3,
                        options=GREEDY)
    assert answer.logprobs is not None and len(answer.logprobs) == answer.eval_count
    first = answer.logprobs[0]
    assert first.logprob <= 0 and len(first.top_logprobs or []) == 3
    assert "".join(entry.token for entry in answer.logprobs) == answer.message.content


def test_embed_and_legacy_embeddings(llama: ollama.Client) -> None:
    both = llama.embed(model=MODEL_ALIAS, input=["red", "a colour"])
    assert len(both.embeddings) == 2 and both.prompt_eval_count >= 2
    assert np.allclose([np.linalg.norm(v) for v in both.embeddings], 1.0, atol=1e-3)
    one = llama.embed(model=MODEL_ALIAS, input="red").embeddings[0]
    legacy = llama.embeddings(model=MODEL_ALIAS, prompt="red").embedding
    assert np.allclose(one, both.embeddings[0], atol=1e-4)
    assert np.allclose(legacy, one, atol=1e-4)


def test_list_show_ps_version(llama: ollama.Client, live: LiveApp) -> None:
    [model] = llama.list().models
    assert model.model == MODEL_ALIAS and len(model.digest or "") == 64
    assert model.details.format == "gguf" and model.details.family == "llama"
    assert model.details.quantization_level == "Q4_1" and model.size > 0
    shown = llama.show(f"{MODEL_ALIAS}:latest")
    # tools: a template without them gets them in its system turn (Hermes' calls)
    assert "<|im_start|>" in shown.template and shown.capabilities == ["completion", "tools",
                                                                       "embedding"]
    assert shown.modelinfo["general.architecture"] == "llama"
    [running] = llama.ps().models
    assert running.model == MODEL_ALIAS and running.context_length > 0
    assert httpx.get(live.url + "/api/version").json()["version"]


def test_a_second_turn_reuses_the_first(llama: ollama.Client) -> None:
    story = "Remember this list: " + ", ".join(f"item {i} is {i * 7}" for i in range(40))
    first = llama.chat(model=MODEL_ALIAS, messages=[{"role": "user", "content": story}],
                       options=GREEDY)
    turns = [{"role": "user", "content": story}, first.message,
             {"role": "user", "content": "And item 3?"}]
    second = llama.chat(model=MODEL_ALIAS, messages=turns, options=GREEDY)
    assert first.prompt_eval_count > 200
    assert second.prompt_eval_count < first.prompt_eval_count / 4


def test_generate_continues_from_its_context(llama: ollama.Client) -> None:
    """Ollama's ``context``: the answer's tokens come back and, sent with the next prompt,
    open it as they are (the earlier turn's KV is reused, not computed again)."""
    story = "Keep these numbers: " + ", ".join(f"entry {i} is {i * 11}" for i in range(40))
    first = llama.generate(model=MODEL_ALIAS, prompt=story, options=GREEDY)
    assert first.context and len(first.context) > first.prompt_eval_count > 200
    second = llama.generate(model=MODEL_ALIAS, prompt="And item 3?", context=first.context,
                            options=GREEDY)
    assert second.context is not None
    assert list(second.context[:len(first.context)]) == list(first.context)
    assert second.prompt_eval_count < first.prompt_eval_count / 4


def test_errors_in_ollamas_shape(llama: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as missing:
        llama.chat(model="nope", messages=COLOURS)
    assert missing.value.status_code == 404 and missing.value.error == "model 'nope' not found"
    with pytest.raises(ollama.ResponseError) as bad:
        llama.chat(model=MODEL_ALIAS, messages=COLOURS, options={"temperature": "hot"})
    assert bad.value.status_code == 400 and "temperature" in bad.value.error
    with pytest.raises(ollama.ResponseError) as images:
        llama.generate(model=MODEL_ALIAS, prompt="What is this?", images=[b"\x89PNG"])
    assert images.value.status_code == 400 and "images" in images.value.error
    with pytest.raises(ollama.ResponseError) as pull:
        llama.pull("llama3.2")
    assert pull.value.status_code == 400
    assert llama.pull(f"{MODEL_ALIAS}:latest").status == "success"


def test_load_and_unload_requests(llama: ollama.Client) -> None:
    loaded = llama.chat(model=MODEL_ALIAS, messages=[])
    assert loaded.done and loaded.done_reason == "load"
    unloaded = llama.generate(model=MODEL_ALIAS, keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert llama.generate(model=MODEL_ALIAS, prompt="Hi", keep_alive="5m",
                          options={"num_predict": 2}).eval_count == 2
    with pytest.raises(ollama.ResponseError) as bad:
        llama.generate(model=MODEL_ALIAS, keep_alive="soon")
    assert bad.value.status_code == 400
