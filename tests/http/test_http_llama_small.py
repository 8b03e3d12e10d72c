"""Small llama-server behaviours on the real model: ``/v1/models`` aliases, several ``--host``
addresses, message lists llama-server refuses."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from http_helpers import MODEL_ALIAS, WAIT_S, free_port, poll
from live import LiveApp

from llamapy.serve import create_app
from llamapy.server import Server


def test_models_list_every_alias_with_the_id_first(server: Server) -> None:
    app = create_app(server, alias="tinyllama-2", aliases=("fim", "code"),
                     tags=("chat", "fim", "small"))
    with LiveApp(app) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        model = http.get("/v1/models").json()["data"][0]
        assert model["id"] == "tinyllama-2"
        assert model["aliases"] == ["tinyllama-2", "fim", "code"]
        assert model["tags"] == ["chat", "fim", "small"]
        for name in model["aliases"]:
            body = {"model": name, "prompt": "Hi", "max_tokens": 1}
            assert http.post("/v1/completions", json=body).status_code == 200


def test_a_single_name_is_its_own_alias(http: httpx.Client) -> None:
    assert http.get("/v1/models").json()["data"][0]["aliases"] == [MODEL_ALIAS]


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "test"}, {"role": "assistant", "content": "test"},
     {"role": "assistant", "content": "test"}],
    [{"role": "system", "content": "test"}, {}],
    [{"role": 123}],
])
def test_message_lists_llama_server_refuses(http: httpx.Client, messages: list) -> None:
    response = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_several_host_addresses(model_path: Path) -> None:
    hosts = ["127.0.0.1", "::1"] if ipv6_loopback() else ["127.0.0.1", "localhost"]
    port = free_port()
    command = [sys.executable, "-m", "llamapy.serve", "-m", str(model_path), "-c", "512",
               "-np", "1", "-t", "1", "--host", ",".join(hosts), "--port", str(port),
               "--api-key", "k"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    try:
        for host in hosts:
            url = f"http://{'[::1]' if host == '::1' else host}:{port}"
            with httpx.Client(base_url=url, timeout=60) as http:
                poll(http, "/health", 200)
                assert http.post("/v1/completions", json={}).status_code == 401
                done = http.post("/v1/completions", headers={"Authorization": "Bearer k"},
                                 json={"prompt": "Once upon a time", "max_tokens": 2})
                assert done.status_code == 200, done.text
    finally:
        process.terminate()
        process.wait(WAIT_S)


PROMPT = "I believe the meaning of life is"


def tokens(http: httpx.Client, text: str, add_special: bool) -> list[int]:
    return http.post("/tokenize", json={"content": text, "add_special": add_special}
                     ).json()["tokens"]


def test_completion_prompt_shapes(http: httpx.Client) -> None:
    ids = tokens(http, PROMPT, True)
    one = http.post("/completion", json={"prompt": ids, "n_predict": 2}).json()
    assert isinstance(one["content"], str) and one["tokens_evaluated"] == len(ids)
    for shape in ([ids, ids], [ids, PROMPT], [ids, {"prompt_string": PROMPT}]):
        many = http.post("/completion", json={"prompt": shape, "n_predict": 2})
        assert many.status_code == 200, many.text
        body = many.json()
        assert isinstance(body, list) and [r["index"] for r in body] == [0, 1]
        assert [r["tokens_evaluated"] for r in body] == [len(ids), len(ids)]
        assert body[0]["prompt"] == body[1]["prompt"]
        assert all(r["tokens_predicted"] == 2 for r in body)
    obj = http.post("/completion", json={"prompt": {"prompt_string": PROMPT}, "n_predict": 1})
    assert obj.status_code == 200 and obj.json()["tokens_evaluated"] == len(ids)
    # one mixed sequence: each string tokenized in place, BOS only for a leading string
    inner = tokens(http, PROMPT, False)
    mixed = http.post("/completion", json={
        "prompt": [1, 2, 3, PROMPT, 7, 8, PROMPT], "n_predict": 1}).json()
    assert mixed["tokens_evaluated"] == 5 + 2 * len(inner)


def test_streamed_prompts_are_indexed(http: httpx.Client) -> None:
    with http.stream("POST", "/completion", json={
            "prompt": [PROMPT, "Once upon a time"], "n_predict": 2, "stream": True}) as response:
        assert response.status_code == 200
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ")]
    finals = [c for c in chunks if c["stop"]]
    assert [c["index"] for c in finals] == [0, 1]
    assert [c["tokens_predicted"] for c in finals] == [2, 2]


@pytest.mark.parametrize("prompt", [[], "", [[]], [{"prompt_string": 3}], [1.5], {"x": 1},
                                    [{"prompt_string": "a", "multimodal_data": ["AAAA"]}],
                                    [1, 2, 10**9]])
def test_bad_prompt_shapes_are_4xx(http: httpx.Client, prompt: object) -> None:
    response = http.post("/completion", json={"prompt": prompt, "n_predict": 1})
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"]["message"]
