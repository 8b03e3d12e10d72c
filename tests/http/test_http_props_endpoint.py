"""llama-server's ``--props``: ``POST /props`` answers 501 (its error shape) unless the server
was started with it; ``GET /props`` says which endpoints are on, as llama-server's does."""

from __future__ import annotations

import httpx
from http_helpers import MODEL_ALIAS
from live import LiveApp

from llamapy.serve import create_app
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.env import env_argv
from llamapy.serve.flags.serving import app_options
from llamapy.server import Server


def test_post_props_is_refused_without_the_flag(http: httpx.Client) -> None:
    refused = http.post("/props", json={})
    assert refused.status_code == 501
    error = refused.json()["error"]
    assert error["type"] == "not_supported_error" and "--props" in error["message"]
    props = http.get("/props").json()
    assert props["endpoint_props"] is False and props["endpoint_slots"] is True
    assert props["endpoint_metrics"] is True and props["total_slots"] == 4


def test_post_props_succeeds_with_the_flag(server: Server) -> None:
    with LiveApp(create_app(server, alias=MODEL_ALIAS, props=True, metrics=False)) as app, \
            httpx.Client(base_url=app.url, timeout=60) as http:
        assert http.post("/props", json={"n_predict": 8}).json() == {"success": True}
        assert http.post("/props", content=b"{").status_code == 400
        props = http.get("/props").json()
        assert props["endpoint_props"] is True and props["endpoint_metrics"] is False


def test_the_flag_and_its_variable() -> None:
    parser = build_parser()
    assert app_options(parser.parse_args([]))["props"] is False
    assert app_options(parser.parse_args(["--props"]))["props"] is True
    env = env_argv(parser, [], {"LLAMA_ARG_ENDPOINT_PROPS": "1"})
    assert app_options(parser.parse_args(env))["props"] is True
