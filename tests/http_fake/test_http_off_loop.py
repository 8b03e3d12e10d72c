"""Request preparation runs off the event loop, and counts are checked before it.

The event loop serves every HTTP request (``/health`` too): a request's template rendering and
tokenization (up to the body limit) must run on a worker thread. The model here records each
tokenization of a request's text that runs on a thread with a running event loop; none may.
A request that asks for more sub-requests than ``max_choices`` is refused before any of its
prompts is tokenized.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from fake_http import ALIAS, FakeApp, fake_app

from llamapy.engine.fake.text import FakeTextModel
from llamapy.errors import InvalidOptionError
from llamapy.openai_api import ServedModel
from llamapy.serve.routes.embeddings import embedding_inputs
from llamapy.server.fake import fake_server

#: Text every request below carries; only its tokenizations are watched.
MARK = "text-of-the-request"
MESSAGES = [{"role": "user", "content": MARK}]


class WatchedModel(FakeTextModel):
    """Records where the request's text is tokenized."""

    def __init__(self) -> None:
        super().__init__("fake.gguf")
        self.on_loop: list[str] = []
        self.tokenized = 0

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False
                 ) -> list[int]:
        if MARK in text:
            self.tokenized += 1
            if _event_loop_running():
                self.on_loop.append(text[:60])
        return super().tokenize(text, add_special, parse_special)


def _event_loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture(scope="module")
def watched() -> Iterator[tuple[FakeApp, WatchedModel]]:
    model = WatchedModel()
    with fake_app(options={"model": model, "max_choices": 3}) as app:
        yield app, model


GENERATING: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "n": 2}),
    ("/v1/completions", {"prompt": MARK, "max_tokens": 2}),
    ("/v1/responses", {"input": MARK, "max_output_tokens": 2}),
    ("/v1/messages", {"model": ALIAS, "messages": MESSAGES, "max_tokens": 2}),
    ("/completion", {"prompt": MARK, "n_predict": 2}),
    ("/completion", {"prompt": [MARK, MARK], "n_predict": 2}),
]
#: Each request whole, each generating one streamed too, and the prompt counts.
PREPARED = [*GENERATING, *((path, {**body, "stream": True}) for path, body in GENERATING),
            ("/tokenize", {"content": MARK}),
            ("/v1/chat/completions/input_tokens", {"messages": MESSAGES}),
            ("/v1/responses/input_tokens", {"input": MARK}),
            ("/v1/messages/count_tokens", {"model": ALIAS, "messages": MESSAGES})]


@pytest.mark.parametrize(("path", "body"), PREPARED,
                         ids=[f"{p}{' stream' if b.get('stream') else ''}" for p, b in PREPARED])
def test_a_request_is_prepared_off_the_event_loop(watched: tuple[FakeApp, WatchedModel],
                                                  path: str, body: dict[str, Any]) -> None:
    app, model = watched
    before, seen = model.tokenized, len(model.on_loop)
    response = app.send("POST", path, json=body)
    assert response.status_code == 200, response.text
    assert model.tokenized > before  # (the watch saw the request's text)
    assert model.on_loop[seen:] == []
    app.check_idle()


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "n": 4}),
    ("/v1/completions", {"prompt": [MARK, MARK], "max_tokens": 2, "n": 2}),
    ("/completion", {"prompt": [MARK] * 4, "n_predict": 2}),
])
def test_more_sub_requests_than_max_choices_are_refused_before_tokenizing(
        watched: tuple[FakeApp, WatchedModel], path: str, body: dict[str, Any]) -> None:
    app, model = watched
    before = model.tokenized
    response = app.send("POST", path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "n"
    assert model.tokenized == before
    app.check_idle()


def test_more_choices_than_the_slots_and_the_queue_hold_are_refused() -> None:
    """2 slots and a queue of 8 (the fake app's) can never hold 11 sub-requests at once."""
    with fake_app() as app:
        response = app.send("POST", "/v1/chat/completions",
                            json={"messages": MESSAGES, "max_tokens": 2, "n": 11})
        assert response.status_code == 400 and response.json()["error"]["param"] == "n"
        app.check_idle()


def test_more_choices_than_one_tenant_may_hold_are_refused() -> None:
    """With ``tenant_max_requests`` 3, 4 choices would be partly admitted, then refused."""
    with fake_app(options={"tenant_max_requests": 3}) as app:
        response = app.send("POST", "/v1/chat/completions",
                            json={"messages": MESSAGES, "max_tokens": 2, "n": 4})
        assert response.status_code == 400 and response.json()["error"]["param"] == "n"
        assert "tenant_max_requests" in response.json()["error"]["message"]
        response = app.send("POST", "/v1/chat/completions",
                            json={"messages": MESSAGES, "max_tokens": 2, "n": 3})
        assert response.status_code == 200, response.text
        app.check_idle()


def test_embedding_inputs_are_bounded_by_max_embedding_inputs() -> None:
    server = fake_server(max_embedding_inputs=3)
    try:
        served = ServedModel(server)
        server.wait_ready(10)
        assert len(embedding_inputs(served, ["a", "b", "c"])) == 3
        with pytest.raises(InvalidOptionError) as info:
            embedding_inputs(served, ["a", "b", "c", "d"])
        assert info.value.option == "input"
    finally:
        server.close()
