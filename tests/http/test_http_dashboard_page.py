"""The live view (``/dashboard``) in a real headless Chromium (see :mod:`browser_page`): a slot
turns busy while a request runs, and the cache chart moves after a repeated prompt."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import browser_page
import httpx
import pytest
from http_helpers import MODEL_ALIAS, chat, wait_slots_free
from live import LiveApp

from llamapy.serve import create_app
from llamapy.server import Server

pytestmark = browser_page.pytestmark

BUSY = '.slot[data-state="decoding"], .slot[data-state="prefilling"]'
ALL_IDLE = "[...document.querySelectorAll('.slot')].every(s => s.dataset.state === 'idle')"


@pytest.fixture
def dashboard(live: LiveApp) -> Iterator[Any]:
    """The live view, once its first snapshot is drawn."""
    with browser_page.browser_page(live.url + "/dashboard") as page:
        page.wait_for_function("Number(document.body.dataset.snapshots) >= 1")
        yield page


def snapshots(page: Any) -> int:
    return int(page.get_attribute("body", "data-snapshots"))


@pytest.fixture
def long_stream(live: LiveApp) -> Iterator[threading.Event]:
    """A long streamed request running until the returned event is set (then cancelled)."""
    stop = threading.Event()

    def run() -> None:
        body = chat("Count from one to one thousand.", max_tokens=800, ignore_eos=True,
                    stream=True)
        with httpx.Client(base_url=live.url, timeout=120) as client, \
                client.stream("POST", "/v1/chat/completions", json=body) as response:
            for _ in response.iter_lines():
                if stop.is_set():
                    return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield stop
    stop.set()
    thread.join(60)


def test_a_slot_turns_busy_while_a_request_runs(dashboard: Any, http: httpx.Client,
                                                long_stream: threading.Event) -> None:
    assert dashboard.locator(".slot").count() == 4
    dashboard.wait_for_selector(BUSY)
    assert dashboard.inner_text("#busy").startswith("1 /")
    long_stream.set()
    wait_slots_free(http)
    dashboard.wait_for_function(ALL_IDLE)
    assert dashboard.inner_text("#conn") == "live"


def test_the_cache_chart_moves_after_a_repeated_prompt(dashboard: Any,
                                                       http: httpx.Client) -> None:
    dashboard.wait_for_function("n => Number(document.body.dataset.snapshots) > n",
                                arg=snapshots(dashboard))  # two snapshots: rates exist
    before = int(dashboard.get_attribute("#reuse-chart", "data-reused") or 0)
    prompt = chat("Describe a lighthouse on a stormy night in two sentences, please.",
                  max_tokens=4)
    for _ in range(2):
        assert http.post("/v1/chat/completions", json=prompt).status_code == 200
    wait_slots_free(http)
    dashboard.wait_for_function(
        "n => Number(document.querySelector('#reuse-chart').dataset.reused) > n", arg=before)
    assert dashboard.locator("#reuse-chart polygon.area").count() >= 2  # computed + reused
    assert int(dashboard.inner_text("#finished")) >= 2
    dashboard.wait_for_function("document.querySelector('#ttft').textContent.endsWith('ms')")


def test_the_live_view_asks_for_the_api_key(server: Server) -> None:
    with LiveApp(create_app(server, alias=MODEL_ALIAS, api_key="secret")) as app, \
            browser_page.browser_page(app.url + "/dashboard") as page:
        page.wait_for_function("document.querySelector('#conn').textContent.includes('API key')")
        assert page.is_visible("#auth") and page.locator(".slot").count() == 0
        page.fill("#api-key", "secret")
        page.dispatch_event("#api-key", "change")
        page.wait_for_function("document.querySelectorAll('.slot').length === 4")
        assert page.inner_text("#conn") == "live"
