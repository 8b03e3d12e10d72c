"""Seed items on the fake backend: the ``name`` start option names the server's thread, and an
unknown ``reasoning_format`` is an unsupported feature in a session's ``DecodeConfig`` and over
HTTP alike."""

from __future__ import annotations

import threading

import pytest
from fake_http import ALIAS, CHAT, FakeApp

from llamapy.errors import InvalidOptionError, UnsupportedFeatureError
from llamapy.options import REASONING_FORMATS, check_reasoning_format
from llamapy.server.fake import fake_server
from llamapy.session import DecodeConfig


def tick_thread_name(**options: object) -> str:
    with fake_server(**options) as server:
        server.wait_ready(10)
        return server.call(lambda engine: threading.current_thread().name, timeout=10)


def test_the_name_start_option_names_the_servers_thread() -> None:
    assert tick_thread_name(name="agent-7") == "agent-7"
    assert tick_thread_name() == "llamapy-server"
    for bad in ("", 7):
        with pytest.raises(InvalidOptionError, match="name"):
            fake_server(name=bad)


def test_an_unknown_reasoning_format_is_an_unsupported_feature() -> None:
    for fmt in REASONING_FORMATS:
        assert check_reasoning_format(fmt) == DecodeConfig(reasoning_format=fmt).reasoning_format
    with pytest.raises(UnsupportedFeatureError) as raised:
        DecodeConfig(reasoning_format="deepseek-legacy")
    assert raised.value.feature == "reasoning_format:deepseek-legacy"
    with pytest.raises(UnsupportedFeatureError):
        check_reasoning_format("deepseek-legacy")


def test_an_unknown_reasoning_format_over_http_is_an_unsupported_feature(app: FakeApp) -> None:
    r = app.client.post("/v1/chat/completions",
                        json={**CHAT, "model": ALIAS, "reasoning_format": "deepseek-legacy"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_feature",
                                               "reasoning_format:deepseek-legacy")
    ok = app.client.post("/v1/chat/completions",
                         json={**CHAT, "model": ALIAS, "reasoning_format": "none"})
    assert ok.status_code == 200, ok.text
