"""llama-server's telemetry fields on the real model: ``timings_per_token``, ``return_progress``
(``prompt_progress`` chunks), ``verbose`` (``__verbose``), ``post_sampling_probs`` (``prob``),
``id_slot`` on chat, and timings that are never null."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import httpx
import openai
import pytest
from http_helpers import MODEL_ALIAS, chat

#: A prompt longer than the shared server's 256-token prefill chunk (so it takes 3 chunks).
LONG = "the quick brown fox jumps over the lazy dog, then it naps in the sun. " * 40


def stream(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON payloads of a streamed response (``[DONE]`` left out)."""
    with http.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def assert_finite(timings: dict[str, Any]) -> None:
    """Every value a number >= 0 (the cache explanation's text only after a reuse)."""
    for key, value in timings.items():
        if key in ("cache_source", "cache_diverged_text"):
            assert timings["cache_n"] > 0 and isinstance(value, str)
            continue
        assert value is not None and math.isfinite(value) and value >= 0, (key, value)


def check_progress(progress: list[dict[str, Any]]) -> None:
    """Progress from the cached prefix to the whole prompt, never backwards."""
    assert len(progress) >= 3, progress  # before the first chunk, then one per chunk
    first, last = progress[0], progress[-1]
    assert first["processed"] == first["cache"] and first["time_ms"] == 0.0
    assert last["processed"] == last["total"] > 256
    for before, after in itertools.pairwise(progress):
        assert after["total"] == before["total"] and after["cache"] == before["cache"]
        assert after["processed"] > before["processed"]
        assert after["time_ms"] >= before["time_ms"]


def test_completion_progress_and_timings_per_token(http: httpx.Client) -> None:
    chunks = stream(http, "/completion", {"prompt": "1 " + LONG, "n_predict": 4,
                                          "cache_prompt": False, "ignore_eos": True,
                                          "timings_per_token": True,
                                          "return_progress": True})
    progress = [c for c in chunks if "prompt_progress" in c]
    check_progress([c["prompt_progress"] for c in progress])
    assert progress[0]["timings"]["prompt_n"] == 0 and progress[0]["timings"]["prompt_ms"] == 0
    tokens = [c for c in chunks if c["tokens"]]
    assert len(tokens) == 4
    assert [c["timings"]["predicted_n"] for c in tokens] == [1, 2, 3, 4]
    for chunk in chunks:
        assert_finite(chunk["timings"])
    assert chunks[-1]["stop"] is True and chunks[-1]["timings"]["predicted_n"] == 4


def test_chat_progress_and_timings_per_token(http: httpx.Client) -> None:
    chunks = stream(http, "/v1/chat/completions", chat(
        "2 " + LONG, max_tokens=4, return_progress=True, timings_per_token=True,
        stream_options={"include_usage": True}))
    progress = [c for c in chunks if "prompt_progress" in c]
    check_progress([c["prompt_progress"] for c in progress])
    assert progress[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert content and all("timings" in c for c in content)
    assert chunks[-1]["choices"] == [] and chunks[-1]["timings"]["predicted_n"] <= 4
    plain = stream(http, "/v1/chat/completions", chat("3 " + LONG, max_tokens=2))
    assert not any("prompt_progress" in c for c in plain)
    assert all("timings" not in c for c in plain[:-1])


def test_responses_progress_with_the_openai_client(client: openai.OpenAI) -> None:
    events = list(client.responses.create(
        model=MODEL_ALIAS, input="4 " + LONG, max_output_tokens=4, stream=True,
        extra_body={"return_progress": True, "timings_per_token": True}))
    progress = [e.model_extra["prompt_progress"] for e in events
                if e.type == "response.in_progress" and "prompt_progress" in (e.model_extra
                                                                              or {})]
    check_progress(progress)
    completed = events[-1]
    assert completed.type in ("response.completed", "response.incomplete")
    assert completed.model_extra and "timings" in completed.model_extra


def test_progress_counts_the_cached_prefix(http: httpx.Client) -> None:
    body = chat("5 " + LONG, max_tokens=1)
    http.post("/v1/chat/completions", json=body).raise_for_status()
    chunks = stream(http, "/v1/chat/completions", {**body, "return_progress": True})
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    cache = progress[0]["cache"]
    assert cache > 256  # the first request's prompt, but its last token
    assert progress[-1]["processed"] == progress[-1]["total"] > cache


@pytest.mark.parametrize("verbose", [True, False])
def test_verbose_has_the_rendered_prompt(http: httpx.Client, verbose: bool) -> None:
    messages = [{"role": "system", "content": "Book"},
                {"role": "user", "content": "What is the best book"}]
    done = http.post("/v1/chat/completions", json={
        "model": MODEL_ALIAS, "messages": messages, "max_tokens": 2, "verbose": verbose})
    assert done.status_code == 200, done.text
    body = done.json()
    if verbose:
        assert "Book" in body["__verbose"]["prompt"]
        assert body["__verbose"]["prompt"].endswith("<|im_start|>assistant\n")
        assert body["__verbose"]["content"] == body["choices"][0]["message"]["content"]
    else:
        assert "__verbose" not in body


def test_bad_verbose_is_400(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json=chat("hi", verbose="yes"))
    assert response.status_code == 400 and response.json()["error"]["param"] == "verbose"


def test_id_slot_is_accepted_on_chat(http: httpx.Client) -> None:
    for _ in range(2):
        done = http.post("/v1/chat/completions", json=chat("Name a book", n=2, id_slot=0,
                                                           max_tokens=4, ignore_eos=True))
        assert done.status_code == 200, done.text
        assert [c["finish_reason"] for c in done.json()["choices"]] == ["length", "length"]


def test_post_sampling_probs_are_probabilities(http: httpx.Client) -> None:
    body = {"prompt": "Today was the day. Today I would finally become a", "n_probs": 10,
            "n_predict": 3, "temperature": 1.0, "seed": 7,
            "cache_prompt": False}  # (both runs compute the prompt in one batch, alike)
    logs = http.post("/completion", json=body).json()["completion_probabilities"]
    probs = http.post("/completion", json={**body, "post_sampling_probs": True}
                      ).json()["completion_probabilities"]
    assert len(probs) == 3
    for tok in probs:
        assert 0.0 < tok["prob"] <= 1.0 and "logprob" not in tok
        assert len(tok["top_probs"]) == 10 and "top_logprobs" not in tok
        assert all(0.0 < p["prob"] <= 1.0 for p in tok["top_probs"])
        ranked = [p["prob"] for p in tok["top_probs"]]
        assert ranked == sorted(ranked, reverse=True)
    # the first token's distribution is the prompt's: the same in both runs
    first = {p["id"]: p["prob"] for p in probs[0]["top_probs"]}
    for entry in logs[0]["top_logprobs"]:
        assert first[entry["id"]] == pytest.approx(math.exp(entry["logprob"]), rel=1e-3)


@pytest.mark.parametrize("n_predict", [1, 8])
def test_timings_are_never_null(http: httpx.Client, n_predict: int) -> None:
    timings = http.post("/completion", json={"prompt": "I believe", "n_predict": n_predict,
                                             "cache_prompt": False, "ignore_eos": True}
                        ).json()["timings"]  # (sampled: without ignore_eos it may stop early)
    assert_finite(timings)
    assert timings["predicted_n"] == n_predict
    assert timings["prompt_ms"] > 0 and timings["prompt_per_token_ms"] > 0
    if n_predict == 1:  # the first token comes with the prompt: no decode step to rate
        assert timings["predicted_per_second"] == 0.0
        assert timings["predicted_per_token_ms"] == 0.0
    else:
        expected = 1e3 / timings["predicted_ms"] * (n_predict - 1)
        assert timings["predicted_per_second"] == pytest.approx(expected)


@pytest.mark.parametrize("field", ["timings_per_token", "return_progress"])
@pytest.mark.parametrize("value", ["yes", 1, [True]])
def test_bad_telemetry_flags_are_400(http: httpx.Client, field: str, value: object) -> None:
    for path, body in (("/completion", {"prompt": "hi", "n_predict": 1}),
                       ("/v1/chat/completions", chat("hi", max_tokens=1))):
        response = http.post(path, json={**body, field: value, "stream": True})
        assert response.status_code == 400, (path, response.text)
        assert response.json()["error"]["param"] == field
