"""llama-server's ``--api-prefix``: every route, the pages and ``/health`` included, is served
under the prefix, and nothing outside it."""

from __future__ import annotations

import re

import httpx
import pytest
from http_helpers import MODEL_ALIAS
from live import LiveApp

from llamapy.errors import InvalidOptionError
from llamapy.serve import create_app
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.env import env_argv
from llamapy.serve.flags.serving import app_options, url_prefix
from llamapy.server import Server


def test_every_route_is_served_under_the_prefix_and_only_there(server: Server) -> None:
    with LiveApp(create_app(server, alias=MODEL_ALIAS, api_prefix="llm/v2/")) as app, \
            httpx.Client(base_url=app.url, timeout=120) as http:
        assert http.get("/llm/v2/health").json() == {"status": "ok"}
        assert http.get("/health").status_code == 404
        assert http.get("/v1/models").status_code == 404
        assert http.get("/llm/v2/v1/models").json()["data"][0]["id"] == MODEL_ALIAS
        done = http.post("/llm/v2/v1/completions", json={
            "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 4
        native = http.post("/llm/v2/completion", json={"prompt": "Hi", "n_predict": 2})
        assert native.status_code == 200 and native.json()["tokens_predicted"] == 2
        page = http.get("/llm/v2/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        for ref in re.findall(r'(?:src|href)="(static/[^"]+)"', page.text):
            assert http.get("/llm/v2/" + ref).status_code == 200, ref  # relative: resolved
        assert http.get("/llm/v2/dashboard").status_code == 200


@pytest.mark.parametrize(("value", "expected"), [
    ("", ""), ("/", ""), ("/llm", "/llm"), ("llm/", "/llm"), ("/a/b/", "/a/b")])
def test_the_prefix_is_normalised_as_llama_server_takes_it(value: str, expected: str) -> None:
    assert url_prefix(value) == expected


@pytest.mark.parametrize("value", ["/a b", "/a?x=1", "/a//b", "/%2e"])
def test_a_prefix_that_is_no_path_is_refused(value: str) -> None:
    with pytest.raises(InvalidOptionError, match="api_prefix"):
        url_prefix(value)


def test_the_flag_and_its_variable_reach_the_app() -> None:
    parser = build_parser()
    assert app_options(parser.parse_args(["--api-prefix", "/llm"]))["api_prefix"] == "/llm"
    env = env_argv(parser, [], {"LLAMA_ARG_API_PREFIX": "/edge"})
    assert app_options(parser.parse_args(env))["api_prefix"] == "/edge"
