"""Loading (503 until ready), the CLI, and the library functions on a bare Model."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from http_helpers import WAIT_S, chat, free_port, poll
from live import LiveApp

from llamapy._native import Model
from llamapy.errors import ModelNotFoundError
from llamapy.openai_api import chat_completion, completion, stream_chat_completion
from llamapy.serve import create_app
from llamapy.server import Server

SMALL = {"n_ctx": 512, "n_parallel": 1, "n_threads": 1}


def test_health_is_503_while_loading(model_path: Path) -> None:
    gate = threading.Event()
    made: list[Server] = []

    def load() -> Server:
        gate.wait(WAIT_S)  # stands for a slow fetch of the model
        made.append(Server(model_path, **SMALL))
        return made[0]

    with LiveApp(create_app(load, own_server=True)) as live, \
            httpx.Client(base_url=live.url, timeout=60) as http:
        loading = http.get("/health")
        assert loading.status_code == 503
        assert loading.json()["error"]["type"] == "server_error"
        assert http.post("/v1/chat/completions", json=chat("hi")).status_code == 503
        gate.set()
        poll(http, "/health", 200)
        body = chat("hi", model=None, max_tokens=2)
        assert http.post("/v1/chat/completions", json=body).status_code == 200
    assert not made[0].ready  # the app owned the server and closed it on shutdown


def test_failed_load_is_503_with_the_reason() -> None:
    def load() -> Server:
        raise ModelNotFoundError("no such model file: /nowhere.gguf")

    with LiveApp(create_app(load)) as live, httpx.Client(base_url=live.url) as http:
        response = poll(http, "/health", 503)
        deadline = time.monotonic() + WAIT_S
        while "nowhere" not in response.json()["error"]["message"]:
            assert time.monotonic() < deadline
            response = http.get("/health")
        assert response.status_code == 503


def test_cli_serves_and_logs_one_startup_line(model_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "llamapy.serve", "--model", str(model_path), "--port",
               str(port), "--alias", "cli-smol", "--n-ctx", "512", "--n-parallel", "1",
               "--threads", "1", "--no-cache-prompt"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               text=True, env=env)
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert f"serving cli-smol ({model_path}) at http://127.0.0.1:{port}/" in line
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            poll(http, "/health", 200)
            assert http.get("/v1/models").json()["data"][0]["id"] == "cli-smol"
            body = chat("hi", model="cli-smol", max_tokens=2)
            assert http.post("/v1/chat/completions", json=body).status_code == 200
    finally:
        process.terminate()
        process.wait(WAIT_S)
    # uvicorn shuts down gracefully, then re-raises the signal as its exit status
    assert process.returncode in (0, -15)


def test_cli_rejects_bad_options() -> None:
    result = subprocess.run([sys.executable, "-m", "llamapy.serve", "--model", "x.gguf",
                             "--n-parallel", "0"], capture_output=True, text=True,
                            timeout=WAIT_S)
    assert result.returncode == 2 and "n_parallel" in result.stderr
    result = subprocess.run([sys.executable, "-m", "llamapy.serve", "--n-parralel", "2"],
                            capture_output=True, text=True, timeout=WAIT_S)
    assert result.returncode == 2 and "unrecognized arguments" in result.stderr


def test_library_functions_on_a_bare_model(model_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("llamapy.openai_api.target.PRIVATE_SERVER_OPTIONS", SMALL)
    with Model(model_path) as model:
        body = {"messages": [{"role": "user", "content": "Say yes."}], "temperature": 0,
                "max_tokens": 4}
        result = chat_completion(model, body)
        assert result["object"] == "chat.completion"
        assert result["model"] == model_path.stem
        chunks = list(stream_chat_completion(model, body))
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                       if c["choices"])
        assert text == result["choices"][0]["message"]["content"]
        done = completion(model, {"prompt": "Yes or no:", "max_tokens": 2, "temperature": 0})
        assert done["usage"]["completion_tokens"] == 2
        with pytest.raises(ModelNotFoundError):
            chat_completion(model, {**body, "model": "another"})
