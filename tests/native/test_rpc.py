"""ggml RPC: a model whose layers live in a ``ggml-rpc-server`` on loopback.

``build_lib.py`` always builds the RPC backend and ``ggml-rpc-server`` next to libllama, so
these tests run wherever the library was built.
"""

from __future__ import annotations

import gc
import logging
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamapy import Server
from llamapy._native import Batch, Context, Model, SamplerChain
from llamapy._paths import current_build
from llamapy.errors import InvalidOptionError, RpcServerError

#: Seconds the RPC server may take to listen.
START_TIMEOUT_S = 30.0
PROMPT = "The capital of France is"
N_TOKENS = 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rpc_server_binary() -> Path:
    build = current_build()
    path = Path(build["build_dir"]) / "bin" / "ggml-rpc-server" if build else None
    if path is None or not path.exists():
        pytest.fail("ggml-rpc-server is missing from the current build: run python build_lib.py")
    return path


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ggml-rpc-server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("ggml-rpc-server did not start listening")


@pytest.fixture(scope="module")
def rpc_endpoint() -> Iterator[str]:
    """One ``ggml-rpc-server`` on a free loopback port (one CPU thread)."""
    port = _free_port()
    proc = subprocess.Popen([str(_rpc_server_binary()), "-H", "127.0.0.1", "-p", str(port),
                             "-t", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, proc)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def _greedy(model: Model, n: int) -> list[int]:
    prompt = model.tokenize(PROMPT, add_special=True)
    with Context(model, n_ctx=256, n_batch=64, n_threads=1) as ctx, \
            SamplerChain(model).add_greedy() as chain:
        batch = Batch(64)
        row = batch.add(0, 0, prompt)
        out: list[int] = []
        for pos in range(len(prompt), len(prompt) + n):
            ctx.decode(batch)
            out.append(chain.sample(ctx, row))
            batch.clear()
            row = batch.add(0, pos, [out[-1]])
    return out


def test_rpc_model_puts_its_layers_on_the_server_and_generates_the_same(
        model_path: Path, rpc_endpoint: str, caplog: pytest.LogCaptureFixture) -> None:
    with Model(model_path) as local:
        expected = _greedy(local, N_TOKENS)
    with caplog.at_level(logging.DEBUG, logger="llamapy.llama_cpp"), \
            Model(model_path, rpc_servers=[rpc_endpoint]) as remote:
        got = _greedy(remote, N_TOKENS)
    buffers = [r.getMessage() for r in caplog.records if "model buffer size" in r.getMessage()]
    assert any("RPC" in line for line in buffers), buffers
    assert got == expected


def test_server_over_rpc_matches_local_greedy_text(model_path: Path, rpc_endpoint: str) -> None:
    options = {"n_ctx": 512, "n_parallel": 1, "n_threads": 1}
    with Server(model_path, **options) as local:
        expected = local.generate(PROMPT, max_tokens=N_TOKENS, temp=0)
    with Server(model_path, rpc_servers=rpc_endpoint, **options) as remote:
        got = remote.generate(PROMPT, max_tokens=N_TOKENS, temp=0)
    # A closed Server's model is freed with the last reference to it; free it while its RPC
    # server still runs (ggml aborts the process when a free cannot reach the server).
    del remote
    gc.collect()
    assert got == expected and got


def test_unreachable_rpc_server_is_a_typed_error(model_path: Path) -> None:
    endpoint = f"127.0.0.1:{_free_port()}"  # nothing listens there
    with pytest.raises(RpcServerError, match="not reachable"):
        Model(model_path, rpc_servers=[endpoint])
    with Model(model_path) as model:  # the process and the library are fine afterwards
        assert model.n_vocab > 0


@pytest.mark.parametrize("bad", ["localhost", "host:port", "a:b:1", "127.0.0.1:70000"])
def test_malformed_rpc_endpoint_is_an_option_error(model_path: Path, bad: str) -> None:
    with pytest.raises(InvalidOptionError, match="rpc_servers"):
        Model(model_path, rpc_servers=[bad])


def test_llama_server_rpc_flag_names_the_servers() -> None:
    from llamapy.serve.cli import build_parser
    from llamapy.serve.flags.start import serve_start_options

    args = build_parser().parse_args(["--rpc", "10.0.0.2:50052,10.0.0.3:50052"])
    assert serve_start_options(args)["rpc_servers"] == ("10.0.0.2:50052", "10.0.0.3:50052")
