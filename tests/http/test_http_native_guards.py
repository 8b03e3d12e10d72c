"""The issue's request on ``/completion`` (a grammar that only allows "x", with "x" biased
away: it used to end the server's process) answers 400 in llama-server's error shape, streamed
or not, while a request beside it finishes and the server serves on."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from http_helpers import WAIT_S, wait_slots_free

NO_TOKEN_LEFT = {"prompt": "Say x:", "grammar": 'root ::= "x"', "logit_bias": [["x", False]],
                 "n_predict": 8}


def wait_processing(http: httpx.Client) -> None:
    """Wait (bounded) until a slot is processing."""
    deadline = time.monotonic() + WAIT_S
    while not any(slot["is_processing"] for slot in http.get("/slots").json()):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def assert_no_token_left(response: httpx.Response) -> None:
    """A 400 in the error shape: the request fails at its first token, before a streamed
    answer sends its headers."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "no token" in error["message"]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_completion_with_no_token_left_is_a_400(http: httpx.Client, temperature: float) -> None:
    wait_slots_free(http)
    bad = {**NO_TOKEN_LEFT, "temperature": temperature, "seed": 3}
    long = {"prompt": "Write a long story about a lighthouse.", "n_predict": 48,
            "ignore_eos": True, "temperature": 0}
    with ThreadPoolExecutor(1) as pool:
        beside = pool.submit(http.post, "/completion", json=long)
        wait_processing(http)
        assert_no_token_left(http.post("/completion", json=bad))
        assert_no_token_left(http.post("/completion", json={**bad, "stream": True}))
        done = beside.result()
    assert done.status_code == 200 and done.json()["tokens_predicted"] == 48
    wait_slots_free(http)
    assert http.get("/health").status_code == 200
    good = http.post("/completion", json={**NO_TOKEN_LEFT, "logit_bias": []})
    assert good.status_code == 200 and good.json()["content"] == "x"
