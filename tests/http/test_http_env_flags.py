"""llama-server's ``LLAMA_ARG_*`` environment variables (:mod:`llamapy.serve.flags.env`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from http_helpers import WAIT_S, free_port, poll

from llamapy.errors import InvalidOptionError
from llamapy.serve.__main__ import main
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.env import LLAMA_ENV, env_argv
from llamapy.serve.flags.serving import app_options
from llamapy.serve.flags.start import start_options


def parse(argv: list[str], environ: dict[str, str]):
    parser = build_parser()
    return parser.parse_args(env_argv(parser, argv, environ) + argv)


def test_every_variable_names_a_flag_of_ours() -> None:
    actions = build_parser()._option_string_actions
    assert len(LLAMA_ENV) > 60
    assert all(flag in actions for flag in LLAMA_ENV.values())


def test_variables_set_flags_and_the_command_line_wins() -> None:
    environ = {"LLAMA_ARG_CTX_SIZE": "1024", "LLAMA_ARG_N_PARALLEL": "3",
               "LLAMA_ARG_CACHE_PROMPT": "false", "LLAMA_ARG_ENDPOINT_METRICS": "disabled",
               "LLAMA_ARG_JINJA": "1", "LLAMA_API_KEY": "k1,k2", "LLAMA_ARG_TEMPERATURE": "0.3"}
    args = parse(["--ctx-size", "2048", "--temp=0.5"], environ)
    assert start_options(args) == {"n_ctx": 2048, "n_parallel": 3, "cache_prompt": False,
                                   "temp": 0.5}
    options = app_options(args)
    keys = [key for key, _ in options["api_keys"].entries]
    assert keys == ["k1", "k2"] and options["metrics"] is False


@pytest.mark.parametrize(("name", "value"), [("LLAMA_ARG_CACHE_PROMPT", "maybe"),
                                             ("LLAMA_ARG_ENDPOINT_SLOTS", "")])
def test_a_switch_variable_takes_yes_or_no_words(name: str, value: str,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidOptionError, match=name):
        parse([], {name: value})
    monkeypatch.setenv(name, value)
    assert main(["--model", "/nonexistent/m.gguf"]) == 2
    assert name in capsys.readouterr().err


def test_a_server_configured_by_variables_alone(model_path: Path) -> None:
    port = free_port()
    environ = {**os.environ, "LLAMA_ARG_MODEL": str(model_path), "LLAMA_ARG_PORT": str(port),
               "LLAMA_ARG_CTX_SIZE": "2048", "LLAMA_ARG_N_PARALLEL": "2",
               "LLAMA_ARG_ALIAS": "from-env", "LLAMA_API_KEY": "secret"}
    process = subprocess.Popen([sys.executable, "-m", "llamapy.serve"], env=environ,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                          headers={"Authorization": "Bearer secret"}) as http:
            assert poll(http, "/health", 200).json() == {"status": "ok"}
            assert http.get("/v1/models").json()["data"][0]["id"] == "from-env"
            assert http.get("/props").json()["total_slots"] == 2
            assert http.get("/v1/models", headers={"Authorization": "Bearer no"}
                            ).status_code == 401
    finally:
        process.terminate()
        process.wait(WAIT_S)


def test_a_variable_of_a_flag_we_lack_is_named_in_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="llamapy.serve"):
        args = parse([], {"LLAMA_ARG_CONTEXT_SHIFT": "1", "LLAMA_ARG_PORT": "9000"})
    assert args.port == 9000
    assert "LLAMA_ARG_CONTEXT_SHIFT" in caplog.text
