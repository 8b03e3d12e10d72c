"""llama-server's wire details that its own test suite checks, on the fake backend."""

from __future__ import annotations

import json

from fake_http import FakeApp, sse_events

MESSAGES = [{"role": "user", "content": "Say something."}]


def stream_chunks(app: FakeApp, body: dict[str, object]) -> list[dict[str, object]]:
    r = app.send("POST", "/v1/chat/completions", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    return [json.loads(d) for _, d in sse_events(r.text) if d != "[DONE]"]


def test_the_first_streamed_chunk_is_the_role_with_null_content(app: FakeApp):
    chunks = stream_chunks(app, {"messages": MESSAGES, "max_tokens": 6, "temperature": 0,
                                 "logprobs": True, "top_logprobs": 2})
    first = chunks[0]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": None}
    for chunk in chunks[1:]:
        assert "role" not in chunk["choices"][0]["delta"]
    app.check_idle()
