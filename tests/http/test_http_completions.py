"""/v1/completions (OpenAI) and /completion (llama-server's native shape)."""

from __future__ import annotations

import json

import httpx
import openai
from http_helpers import MODEL_ALIAS

PROMPT = "The three primary colours are"


def sse(response: httpx.Response) -> list[str]:
    """The ``data:`` payloads of an SSE response."""
    return [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]


def test_completion_text_stream_and_usage(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL_ALIAS, prompt=PROMPT, max_tokens=12,
                                     temperature=0)
    assert full.object == "text_completion" and full.id.startswith("cmpl-")
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 12
    stream = client.completions.create(model=MODEL_ALIAS, prompt=PROMPT, max_tokens=12,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == 12


def test_a_streamed_completions_final_chunk_carries_usage_as_llama_server_does(
        client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=MODEL_ALIAS, prompt=PROMPT, max_tokens=7,
                                            temperature=0, stream=True))
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0] is chunks[-1]  # no separate usage chunk unasked
    assert finals[0].usage.completion_tokens == 7
    assert finals[0].usage.prompt_tokens == finals[0].usage.total_tokens - 7 > 0


def test_prompt_list_and_token_prompts(client: openai.OpenAI, http: httpx.Client) -> None:
    ids = http.post("/tokenize", json={"content": PROMPT}).json()["tokens"]
    result = client.completions.create(model=MODEL_ALIAS, prompt=[PROMPT, "Once upon a time"],
                                       max_tokens=6, temperature=0)
    assert [c.index for c in result.choices] == [0, 1]
    assert result.usage.completion_tokens == 12
    by_tokens = client.completions.create(model=MODEL_ALIAS, prompt=ids, max_tokens=6,
                                          temperature=0)
    assert by_tokens.choices[0].text == result.choices[0].text
    by_token_lists = client.completions.create(model=MODEL_ALIAS, prompt=[ids, ids],
                                               max_tokens=6, temperature=0)
    assert [c.text for c in by_token_lists.choices] == [result.choices[0].text] * 2


def test_echo_and_legacy_logprobs(client: openai.OpenAI) -> None:
    echoed = client.completions.create(model=MODEL_ALIAS, prompt=PROMPT, max_tokens=4,
                                       temperature=0, echo=True)
    assert echoed.choices[0].text.startswith(PROMPT)
    result = client.completions.create(model=MODEL_ALIAS, prompt=PROMPT, max_tokens=4,
                                       temperature=0, logprobs=2)
    logprobs = result.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 4
    assert "".join(logprobs.tokens) == result.choices[0].text
    assert all(len(top) == 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0


def assert_same_greedy_run(first: dict, again: dict, tie_nats: float = 0.25) -> None:
    """``again`` (its prompt from the cache) generates ``first``'s tokens, but where two
    candidates were near-tied in ``first``: the KV of a reused prefix was computed in another
    batch shape, so its logits may differ in the last bits (llama-server documents the same of
    ``cache_prompt``); from there on the runs may differ."""
    for i, (mine, theirs) in enumerate(zip(first["tokens"], again["tokens"], strict=True)):
        if mine != theirs:
            top = first["completion_probabilities"][i]["top_logprobs"]
            assert theirs == top[1]["id"], (i, first["content"], again["content"])
            assert top[0]["logprob"] - top[1]["logprob"] < tie_nats, top
            return
    assert again["content"] == first["content"]


def test_native_completion(http: httpx.Client) -> None:
    body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "cache_prompt": True,
            "n_probs": 2, "return_tokens": True, "id_slot": -1}
    result = http.post("/completion", json=body).json()
    assert result["stop"] is True and result["tokens_predicted"] == 8
    assert result["stop_type"] == "limit" and len(result["tokens"]) == 8
    assert result["tokens_evaluated"] > 0 and result["model"] == MODEL_ALIAS
    timings = result["timings"]
    assert {"prompt_n", "prompt_ms", "predicted_n", "predicted_per_second", "cache_n"
            } <= set(timings)
    assert len(result["completion_probabilities"]) == 8
    again = http.post("/completion", json=body).json()
    assert_same_greedy_run(result, again)
    assert again["timings"]["cache_n"] > 0
    assert "cache_diverged_at" not in again["timings"]  # the whole prompt matched
    assert again["timings"]["cache_source"] in ("own", "donor", "ram", "inflight", "disk")


def test_native_completion_stream(http: httpx.Client) -> None:
    body = {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "stream": True}
    response = http.post("/completion", json=body)
    events = [json.loads(data) for data in sse(response)]
    assert events[-1]["stop"] is True and "timings" in events[-1]
    assert all(not e["stop"] for e in events[:-1])
    text = "".join(e["content"] for e in events)
    assert text == http.post("/completion", json={**body, "stream": False}).json()["content"]
    assert "[DONE]" not in response.text


def test_ignore_eos_generates_the_whole_budget(client: openai.OpenAI, http: httpx.Client) -> None:
    """llama-server's ``ignore_eos``: the end-of-generation tokens are banned."""
    chat = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    stops = client.completions.create(model=MODEL_ALIAS, prompt=chat, max_tokens=200,
                                      temperature=0)
    assert stops.choices[0].finish_reason == "stop"  # the model ends its short answer
    forced = client.completions.create(model=MODEL_ALIAS, prompt=chat, max_tokens=200,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert forced.choices[0].finish_reason == "length"
    assert forced.usage.completion_tokens == 200
    native = http.post("/completion", json={"prompt": chat, "n_predict": 40,
                                            "ignore_eos": True, "temperature": 0}).json()
    assert native["tokens_predicted"] == 40 and native["stop_type"] == "limit"
    bad = http.post("/completion", json={"prompt": chat, "ignore_eos": "yes"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
