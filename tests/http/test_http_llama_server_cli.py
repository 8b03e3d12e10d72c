"""A llama-server command line runs ``python -m llamapy.serve`` unchanged (the README's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from http_helpers import WAIT_S, free_port, poll

#: The README's llama-server command line, after ``-m MODEL`` and before ``--port PORT``.
LLAMA_SERVER_ARGS = ("-c 8192 -np 4 -t 2 -b 2048 -ub 512 -ngl 99 -fa auto -kvu --temp 0.7 "
                     "--alias mymodel --api-key KEY --cache-ram 2048 --metrics --jinja")


def test_readme_command_line_runs_unchanged() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    assert ("python -m llamapy.serve -m model.gguf -c 8192 -np 4 -t 2 -b 2048 -ub 512 -ngl 99 "
            "-fa auto -kvu --temp 0.7 --alias mymodel --port 8080 --api-key KEY "
            "--cache-ram 2048 --metrics --jinja") in readme


def test_llama_server_command_line_serves(model_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "llamapy.serve", "-m", str(model_path),
               *LLAMA_SERVER_ARGS.split(), "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    try:
        auth = {"Authorization": "Bearer KEY"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                          headers=auth) as http:
            assert poll(http, "/health", 200).json() == {"status": "ok"}
            assert http.get("/v1/models").json()["data"][0]["id"] == "mymodel"
            assert http.get("/v1/models", headers={"Authorization": "Bearer nope"}
                            ).status_code == 401
            body = {"model": "mymodel", "prompt": "The capital of France is",
                    "max_tokens": 3}
            done = http.post("/v1/completions", json=body)
            assert done.status_code == 200, done.text
            assert done.json()["usage"]["completion_tokens"] >= 1
            props = http.get("/props").json()
            assert props["total_slots"] == 4
            assert props["default_generation_settings"]["n_ctx"] == 8192
            assert "llamapy_" in http.get("/metrics").text
    finally:
        process.terminate()
        process.wait(WAIT_S)
    assert process.returncode in (0, -15)
