"""Hostile requests on the real model: each is a 4xx naming its field (or runs bounded), and
the server keeps serving; sub-requests of one HTTP request live and die together."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from http_helpers import chat, wait_slots_free

from llamapy.errors import SamplingTooCostlyError
from llamapy.server import Server

OPENAI_400: list[tuple[str, dict]] = [
    ("session", {"session": [[1]]}),  # the request that used to stop the server for good
    ("top_k", {"top_k": 2**32}),
    ("n_probs", {"n_probs": 100_000}),
    ("stop", {"stop": [f"s{i}" for i in range(33)]}),
    ("stop", {"stop": ["x" * 257]}),
    ("logit_bias", {"logit_bias": {str(i): 1 for i in range(1025)}}),
    ("logit_bias", {"logit_bias": [[10**9, 1]]}),
    ("samplers", {"samplers": ["top_k"] * 33}),
    ("dry_sequence_breakers", {"dry_sequence_breakers": ["b"] * 33}),
    ("grammar", {"grammar": 'root ::= "' + "g" * 300_000 + '"'}),
    ("n", {"n": 100}),  # more than 4 slots plus a queue of 32 could ever hold
    # groups nested 20,000 deep overflowed the stack of libllama's recursive parser (SIGSEGV)
    ("grammar", {"grammar": "root ::= " + "(" * 20_000 + '"x"' + ")" * 20_000}),
    # a trigger pattern only a backtracker can run (a look-around) is refused at the edge
    ("grammar_triggers", {"grammar": 'root ::= "x"', "grammar_triggers": ["a(?!b)"]}),
]


@pytest.mark.parametrize(("field", "extra"), OPENAI_400, ids=[f for f, _ in OPENAI_400])
def test_a_hostile_chat_field_is_a_400_naming_it(http: httpx.Client, field: str,
                                                 extra: dict) -> None:
    response = http.post("/v1/chat/completions", json=chat("hi", max_tokens=2, **extra))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == field
    assert http.post("/v1/chat/completions", json=chat("hi", max_tokens=2)).status_code == 200


#: Trigger patterns that crashed (250 nested groups: SIGSEGV) or froze (catastrophic
#: backtracking) libllama's ``std::regex`` matcher on the tick thread.
REGEX_BOMBS = ["(" * 250 + "a" + ")" * 250, ".{32}(.|.|.)*x", "(x+x+)+y", "(.*){12}#"]


@pytest.mark.parametrize("pattern", REGEX_BOMBS, ids=["nested", "dotstar", "xx", "star12"])
def test_a_trigger_pattern_runs_in_linear_time(http: httpx.Client, pattern: str) -> None:
    body = chat("Write a long story about a cat.", max_tokens=64, temperature=0,
                grammar='root ::= "x"', grammar_triggers=[pattern])
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert http.post("/v1/chat/completions", json=chat("hi", max_tokens=2)).status_code == 200


def test_a_window_past_the_context_runs_fitted_to_it(http: httpx.Client) -> None:
    """``penalty_last_n = 2**31 - 1`` made libllama allocate a ring of that many tokens (16 s
    on the tick thread); it now reaches C as the context's length."""
    body = chat("hi", max_tokens=4, penalty_last_n=2**31 - 1, repeat_penalty=1.1)
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text


def test_native_completion_prompts_are_counted_before_tokenizing(http: httpx.Client) -> None:
    response = http.post("/completion", json={"prompt": ["p"] * 200, "n_predict": 1})
    assert response.status_code == 400 and "n:" in response.json()["error"]["message"]


def _finished(server: Server) -> dict[str, int]:
    return dict(server.stats()["finish_reasons"])


def test_a_429_sibling_cancels_the_others_at_once(http: httpx.Client, server: Server) -> None:
    """``n`` = 36 choices on 4 slots and a queue of 32, with one other request running: the
    36th cannot queue, the HTTP answer is a 429 at once, and the 35 admitted siblings are
    cancelled (none runs to its 400 tokens), leaving the slots and the queue empty."""
    before = _finished(server)
    blocker = server.open_stream(server.tokenize("Count to a thousand:"), max_tokens=3000,
                                 logit_bias={server.model.eos: float("-inf")})
    try:
        next(iter(blocker))
        body = chat("Write a story.", max_tokens=400, n=36, ignore_eos=True)
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 429, response.text
    finally:
        blocker.cancel()
    wait_slots_free(http)
    after = _finished(server)
    assert after.get("max_tokens", 0) == before.get("max_tokens", 0)
    assert after.get("cancelled", 0) - before.get("cancelled", 0) >= 36  # 35 and the blocker
    assert server.stats()["queue_depth"] == 0


def test_embedding_inputs_are_counted_before_any_is_embedded(http: httpx.Client) -> None:
    response = http.post("/v1/embeddings", json={"input": ["a"] * 2049})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input"


def test_a_grammar_too_costly_per_token_fails_alone(model_path: Path) -> None:
    """A grammar of 20,000 alternatives costs far more than ``max_sample_ms`` = 100 per token
    on this model's vocabulary: that request ends with a 400-class error after one token's
    work, and a plain request on the other slot finishes."""
    with Server(model_path, n_ctx=1024, n_parallel=2, max_sample_ms=100, n_threads=1) as server:
        ids = server.wait_ready(60).tokenize("Say a word:")
        grammar = "root ::= " + " | ".join(f'"w{i}"' for i in range(20_000))
        with pytest.raises(SamplingTooCostlyError) as info:
            server.complete_tokens(ids, max_tokens=4, grammar=grammar, temp=0)
        assert info.value.http_status == 400
        assert server.complete_tokens(ids, max_tokens=4, temp=0).completion_tokens == 4
