"""A request that makes libllama fail ends alone with its typed error; the request running
beside it finishes, and the server serves the next one.

The request is the issue's: a grammar that only allows "x" with "x" biased away. Before the
shim, greedy sampling aborted the process (GGML_ABORT in llama.cpp's grammar) and sampled
generation threw through cffi (``std::terminate``).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from server_helpers import wait_idle

from llamapy.errors import NoCandidateError
from llamapy.server import Server

PROMPT = "<|im_start|>user\nWrite a long story about a lighthouse.<|im_end|>\n" \
         "<|im_start|>assistant\n"


def busy_requests(server: Server) -> list[str]:
    return [s["request_id"] for s in server.slots() if s["request_id"] is not None]


def wait_busy(server: Server, n: int) -> None:
    """Wait (bounded) until ``n`` slots run a request."""
    deadline = time.monotonic() + 30
    while len(busy_requests(server)) < n:
        assert time.monotonic() < deadline, server.slots()
        time.sleep(0.01)


@pytest.mark.parametrize("sampling", [{"temp": 0.0}, {"temp": 0.8, "seed": 5}])
def test_no_token_left_fails_that_request_only(server: Server, sampling: dict) -> None:
    before = wait_idle(server)
    (x,) = server.tokenize("x", add_special=False)
    bad = {"grammar": 'root ::= "x"', "logit_bias": {x: float("-inf")}, "max_tokens": 8,
           **sampling}
    no_end = dict.fromkeys(server.model.eog_tokens(), float("-inf"))
    with ThreadPoolExecutor(1) as pool:
        beside = pool.submit(server.complete, PROMPT, max_tokens=48, logit_bias=no_end, temp=0.0)
        wait_busy(server, 1)
        with pytest.raises(NoCandidateError) as caught:
            server.generate("Say x:", **bad)
        assert caught.value.http_status == 400
        assert len(busy_requests(server)) == 1  # the other one runs on
        done = beside.result()
    assert (done.completion_tokens, done.finish_reason) == (48, "max_tokens")
    assert server.generate("Say x:", grammar='root ::= "x"', max_tokens=4, temp=0.0) == "x"
    after = wait_idle(server)
    server.call(lambda engine: engine.check_integrity())
    assert after["num_errors"] == before["num_errors"] + 1
