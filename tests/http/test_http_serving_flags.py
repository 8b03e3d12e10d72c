"""llama-server's serving flags: what each parses to and what the app then does (no model:
the app's model never finishes loading, and the endpoints tested answer before needing it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from llamapy.chat.builtin_templates import BUILTIN_TEMPLATES
from llamapy.errors import InvalidOptionError, LoadFailedError
from llamapy.openai_api.target import ServedModel
from llamapy.serve import create_app
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.serving import app_options
from llamapy.server import Server
from llamapy.server.chat_format import ChatTemplates

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def options(*argv: str) -> dict:
    return app_options(build_parser().parse_args(list(argv)))


def test_alias_is_repeatable_and_comma_separated_and_the_first_in_order_is_public() -> None:
    got = options("--alias", "tinyllama-2,fim", "-a", "code,fim", "--tags", "small, chat,fim")
    assert (got["alias"], got["aliases"], got["tags"]) == ("code", ("fim", "tinyllama-2"),
                                                           ("chat", "fim", "small"))
    assert (options()["alias"], options()["aliases"]) == (None, ())
    assert options("--alias", "mymodel")["alias"] == "mymodel"


def test_cors_origins_is_llama_servers_spelling_of_cors_origin() -> None:
    got = options("--cors-origins", "http://a.test,http://b.test", "--cors-origin", "http://c")
    assert got["cors_origins"] == ("http://a.test", "http://b.test", "http://c")


def test_verbose_is_log_level_debug() -> None:
    for flag in ("-v", "--verbose", "--log-verbose"):
        assert build_parser().parse_args([flag]).log_level == "debug"
    assert build_parser().parse_args([]).log_level == "info"


def test_endpoint_switches() -> None:
    assert {k: options()[k] for k in ("webui", "slots", "metrics")} == {
        "webui": True, "slots": True, "metrics": True}
    off = options("--no-webui", "--no-slots", "--no-metrics")
    assert (off["webui"], off["slots"], off["metrics"]) == (False, False, False)
    on = options("--metrics", "--slots", "--webui", "--jinja", "--embeddings", "--embedding")
    assert (on["webui"], on["slots"], on["metrics"]) == (True, True, True)
    assert options("--no-jinja") == options("--jinja") == options()


def test_request_defaults() -> None:
    got = options("-n", "64", "--reasoning-format", "none", "-rea", "off")
    assert (got["n_predict"], got["reasoning_format"]) == (64, "none")
    assert got["template_kwargs"] == {"enable_thinking": False}
    assert options("--reasoning", "on")["template_kwargs"] == {"enable_thinking": True}
    assert options("--n-predict", "8")["n_predict"] == options("--predict", "8")["n_predict"] == 8
    assert (options()["n_predict"], options()["template_kwargs"]) == (-1, {})
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--reasoning-format", "deepseek-legacy"])


@pytest.mark.parametrize("name", ["chatml", "llama3"])
def test_builtin_template_names(name: str) -> None:
    source = options("--chat-template", name)["chat_template"]
    assert source == BUILTIN_TEMPLATES[name]
    with ChatTemplates(None, source, bos="<s>", eos="</s>") as templates:
        text = templates.apply({"messages": MESSAGES, "add_generation_prompt": True}).prompt
    expected = {
        "chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\n",
        "llama3": "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n",
    }
    assert text == expected[name]


def test_chat_template_file_path_and_source(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}", encoding="utf-8")
    assert options("--chat-template-file", str(path))["chat_template"] == path.read_text()
    assert options("--chat-template", str(path))["chat_template"] == path.read_text()
    assert options("--chat-template", "{{ x }}")["chat_template"] == "{{ x }}"


class _Stub:
    """Stands for a Server in ServedModel's budget and name logic."""

    model_path = "/models/smol.gguf"
    n_ctx_seq = 1000


def test_n_predict_is_the_default_budget_within_the_context() -> None:
    def served(**kw: object) -> ServedModel:
        return ServedModel(_Stub(), **kw)  # type: ignore[arg-type]

    assert served().default_max_tokens(100) == 900
    assert served(n_predict=64).default_max_tokens(100) == 64
    assert served(n_predict=5000).default_max_tokens(100) == 900
    names = served(name="mymodel", aliases=("other",)).names
    assert {"mymodel", "other", "smol"} <= names
    with pytest.raises(InvalidOptionError):
        served(reasoning_format="deepseek-legacy")


@pytest.fixture
def unloaded() -> Iterator[threading.Event]:
    gate = threading.Event()
    yield gate
    gate.set()


def _app(gate: threading.Event, **kw: object) -> Starlette:
    def load() -> Server:
        gate.wait(60)
        raise LoadFailedError(RuntimeError("test over"))

    return create_app(load, **kw)  # type: ignore[arg-type]


def test_no_webui_no_slots_no_metrics(unloaded: threading.Event) -> None:
    with TestClient(_app(unloaded), base_url="http://localhost") as client:
        assert client.get("/").status_code == 200
        assert client.get("/dashboard").status_code == 200
        assert client.get("/metrics").status_code == 200
    with TestClient(_app(unloaded, webui=False, slots=False, metrics=False),
                    base_url="http://localhost") as client:
        assert client.get("/").status_code == 404
        assert client.get("/dashboard").status_code == 404
        for path, flag in (("/slots", "--slots"), ("/metrics", "--metrics")):
            response = client.get(path)
            assert response.status_code == 501, path
            assert response.json()["error"]["type"] == "not_supported_error"
            assert flag in response.json()["error"]["message"]


def test_accept_any_model_is_off_unless_asked() -> None:
    assert options()["accept_any_model"] is False
    assert options("--accept-any-model")["accept_any_model"] is True
