"""Media sent over HTTP reaches the encoder's queue as the API key's tenant's
(:mod:`llamapy.media.queue`: tenants take turns and have their own bound), on every route that
takes images; and the queue's refusal is a typed 429."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
from fake_http import ALIAS, FakeApp, fake_app

from llamapy.media import FakeMediaEncoder
from llamapy.media.queue import EncoderQueue
from llamapy.media.samples import png
from llamapy.serve.tenants import KeyTable

KEYS = "ka acme\nkb beta\nkadm ops admin\nkdef\n"
TENANT_OF = {"ka": "acme", "kb": "beta", "kadm": "ops", "kdef": None}
IMAGE = png(8, 8, (10, 200, 30))
B64 = base64.b64encode(IMAGE).decode()
URL = f"data:image/png;base64,{B64}"
USER = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": URL}}]

ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": USER}], "max_tokens": 2}),
    ("/completion", {"prompt": {"prompt_string": "look: <__media__> now", "multimodal_data": [B64]},
                     "n_predict": 2}),
    ("/v1/messages", {"model": ALIAS, "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": B64}}]}]}),
    ("/api/chat", {"model": ALIAS, "stream": False, "options": {"num_predict": 2},
                   "messages": [{"role": "user", "content": "what?", "images": [B64]}]}),
]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def app() -> Iterator[FakeApp]:
    with fake_app(options={"mmproj": "fake"},
                  app_options={"api_keys": KeyTable.parse(KEYS)}) as served:
        yield served


def encoder(app: FakeApp) -> FakeMediaEncoder:
    media = app.server._loop.media
    assert isinstance(media, FakeMediaEncoder)
    return media


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_media_is_encoded_as_the_keys_tenants(app: FakeApp, path: str, body: dict[str, Any]
                                              ) -> None:
    seen: list[str | None] = []
    encoder(app).on_encode = lambda tenant, index: seen.append(tenant)
    try:
        for key, tenant in TENANT_OF.items():
            seen.clear()
            r = app.send("POST", path, json=body, headers=auth(key))
            assert r.status_code == 200, r.text
            assert seen == [tenant], (path, key)
    finally:
        encoder(app).on_encode = None
    assert encoder(app).queue.held_bytes == 0


def test_media_over_the_bound_is_a_typed_refusal(app: FakeApp) -> None:
    media = encoder(app)
    saved = media.queue
    media.queue = EncoderQueue(tenant_max_bytes=3 * 8 * 8 - 1)
    try:
        r = app.send("POST", ROUTES[0][0], json=ROUTES[0][1], headers=auth("ka"))
    finally:
        media.queue = saved
    assert r.status_code == 400 and "one tenant's media may hold" in r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
