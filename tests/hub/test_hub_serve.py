"""``python -m llamapy.serve -hf ORG/REPO:QUANT``: bad flag values refused before anything
loads, and, as a subprocess against the Hub stand-in serving the real test model, a clean cache
downloads and serves it; ``--offline`` then serves it from the cache without one request."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hub_standin import HubStandin, Repo, tiny_files

from llamapy.models import default_model_path
from llamapy.serve.__main__ import main
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.env import env_argv

REPO = "org/smol-GGUF"
WAIT_S = 60.0


@pytest.mark.parametrize("argv", [
    ["-hf", ""], ["-hf", "org"], ["-hf", "org/repo:"], ["--hf-repo", "org/repo:Q4 K"],
    ["-hf", "o/r", "--hf-token", "a b"], ["-hf", "o/r", "-hft", ""],
    ["-hff", "m.gguf"], ["-hf", "o/r", "-hff", "../m.gguf"], ["-m", "x.gguf", "-hf", "o/r"],
])
def test_bad_hub_flags_are_refused_before_anything_loads(
        argv: list[str], hub_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_llama_servers_hub_variables_are_read() -> None:
    env = {"LLAMA_ARG_HF_REPO": "org/repo:Q8_0", "LLAMA_ARG_HF_FILE": "m.gguf",
           "LLAMA_ARG_OFFLINE": "1"}
    args = build_parser().parse_args(env_argv(build_parser(), [], env))
    assert (args.hf_repo, args.hf_file, args.offline) == ("org/repo:Q8_0", "m.gguf", True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture()
def smol_hub(hub_env: Path) -> Iterator[HubStandin]:
    """The stand-in with the real test model as the Q4_K_M of :data:`REPO`, beside small
    files named with other tags."""
    files = {**tiny_files(), "smol-Q4_K_M.gguf": default_model_path()}
    del files["tiny-Q4_K_M.gguf"]
    with HubStandin({REPO: Repo(files)}) as standin:
        yield standin


def _serve(*argv: str, endpoint: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {**os.environ, "HF_ENDPOINT": endpoint}
    cwd = Path(__file__).resolve().parents[2]  # this checkout's llamapy first
    proc = subprocess.Popen([sys.executable, "-m", "llamapy.serve", *argv, "--port", str(port),
                             "-c", "512", "-np", "1"], env=env, cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc, f"http://127.0.0.1:{port}"


def _ready(proc: subprocess.Popen[bytes], url: str) -> httpx.Response:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            return httpx.get(url + "/v1/models", timeout=2).raise_for_status()
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError("the server never answered")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_serve_hf_downloads_then_serves_offline(smol_hub: HubStandin, hub_env: Path) -> None:
    proc, url = _serve("-hf", f"{REPO}:Q4_K_M", endpoint=smol_hub.url)
    try:
        models = _ready(proc, url).json()["data"]
        assert models[0]["id"] == "smol-Q4_K_M"
        done = httpx.post(url + "/v1/completions", timeout=30, json={
            "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}).json()
        assert done["usage"]["completion_tokens"] > 0 and done["choices"][0]["text"]
    finally:
        _stop(proc)
    assert (hub_env / "hub" / "models--org--smol-GGUF").is_dir()
    seen = len(smol_hub.requests)
    proc, url = _serve("-hf", f"{REPO}:q4_k_m", "--offline", endpoint=smol_hub.url)
    try:
        assert _ready(proc, url).json()["data"][0]["id"] == "smol-Q4_K_M"
    finally:
        _stop(proc)
    assert len(smol_hub.requests) == seen  # --offline: not one request


def test_serve_offline_without_the_model_is_a_clear_error(smol_hub: HubStandin) -> None:
    proc, _ = _serve("-hf", f"{REPO}:Q4_K_M", "--offline", endpoint=smol_hub.url)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and b"not in the local cache" in err
    assert smol_hub.requests == []
