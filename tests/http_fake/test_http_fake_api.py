"""Each API family of the real app, served in-process on the fake backend.

The fake model's next token is a pure function of the prompt's tokens (greedy with
``temperature: 0``), so an answer's text is checked against the fake model's reference output
for the prompt the route rendered: the template, the tokenizer, the engine and the response
framing all have to be right for it to match.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fake_http import ALIAS, CHAT, FakeApp, sse_events
from starlette.testclient import TestClient

from llamapy.engine.options import SamplingParams
from llamapy.errors import LoadFailedError
from llamapy.runtime import Hosted
from llamapy.serve import create_app
from llamapy.server import Server

GREEDY = SamplingParams(temp=0.0)
MESSAGES = [{"role": "user", "content": "Say something."}]


def expected_text(app: FakeApp, prompt_ids: list[int], max_tokens: int) -> tuple[str, bool]:
    """The fake model's greedy output for ``prompt_ids`` (text, whether it ended at EOG)."""
    model = app.server.model
    tokens = model.fake.reference(prompt_ids, max_tokens, GREEDY)
    ended = tokens[-1] == model.eos
    return model.detokenize(tokens[:-1] if ended else tokens), ended


def chat_prompt_ids(app: FakeApp, messages: list[dict[str, str]]) -> list[int]:
    prompt = app.send("POST", "/apply-template", json={"messages": messages}).json()["prompt"]
    return app.send("POST", "/tokenize", json={"content": prompt}).json()["tokens"]


def test_chat_answers_the_fake_models_output_for_the_rendered_prompt(app: FakeApp):
    r = app.send("POST", "/v1/chat/completions",
                 json={"model": ALIAS, "messages": MESSAGES, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200
    body = r.json()
    text, ended = expected_text(app, chat_prompt_ids(app, MESSAGES), 12)
    assert body["choices"][0]["message"]["content"] == text
    assert body["choices"][0]["finish_reason"] == ("stop" if ended else "length")
    assert body["usage"]["prompt_tokens"] == len(chat_prompt_ids(app, MESSAGES))
    app.check_idle()


def test_a_streamed_chat_carries_the_same_text_then_done(app: FakeApp):
    request = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0}
    whole = app.send("POST", "/v1/chat/completions", json=request).json()
    r = app.send("POST", "/v1/chat/completions", json={**request, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [data for _, data in sse_events(r.text)]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(data) for data in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    app.check_idle()


def test_text_completions_continue_the_prompt_bytes(app: FakeApp):
    r = app.send("POST", "/v1/completions",
                 json={"prompt": "Once upon", "max_tokens": 10, "temperature": 0})
    assert r.status_code == 200
    ids = app.send("POST", "/tokenize", json={"content": "Once upon"}).json()["tokens"]
    assert r.json()["choices"][0]["text"] == expected_text(app, ids, 10)[0]
    streamed = app.send("POST", "/v1/completions", json={"prompt": "Once upon", "max_tokens": 10,
                                                         "temperature": 0, "stream": True})
    parts = [json.loads(d) for _, d in sse_events(streamed.text) if d != "[DONE]"]
    assert "".join(p["choices"][0]["text"] for p in parts if p["choices"]) == \
        r.json()["choices"][0]["text"]


def test_anthropic_messages_answer_and_stream_in_anthropics_shape(app: FakeApp):
    request = {"model": ALIAS, "max_tokens": 12, "temperature": 0, "messages": MESSAGES}
    r = app.send("POST", "/v1/messages", json=request)
    assert r.status_code == 200
    body = r.json()
    text, ended = expected_text(app, chat_prompt_ids(app, MESSAGES), 12)
    assert body["type"] == "message" and body["content"] == [{"type": "text", "text": text}]
    assert body["stop_reason"] == ("end_turn" if ended else "max_tokens")
    streamed = app.send("POST", "/v1/messages", json={**request, "stream": True})
    names = [name for name, _ in sse_events(streamed.text)]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    deltas = [json.loads(d)["delta"] for n, d in sse_events(streamed.text)
              if n == "content_block_delta"]
    assert "".join(d["text"] for d in deltas) == text
    app.check_idle()


def test_anthropic_errors_use_anthropics_shape(app: FakeApp):
    r = app.send("POST", "/v1/messages", json={"model": ALIAS, "messages": MESSAGES})
    assert r.status_code == 400
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_routing_and_body_limit_errors_use_the_routes_shape_too(app: FakeApp):
    """A 405 (answered by the router) and a 413 (by the body limit, before routing) on
    ``/v1/messages`` are Anthropic-shaped; on ``/v1/chat/completions`` OpenAI-shaped."""
    r = app.send("GET", "/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"
    big = b"[" + b"1," * 9_000_000 + b"1]"  # past the default body limit (16 MiB)
    headers = {"content-type": "application/json"}
    r = app.client.post("/v1/messages", content=big, headers=headers)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    r = app.client.post("/v1/chat/completions", content=big, headers=headers)
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"


def test_a_schema_nested_too_deeply_to_convert_is_a_400(app: FakeApp):
    """A JSON schema nested 300 levels deep used to exhaust Python's recursion (a 500)."""
    schema: dict = {"type": "string"}
    for _ in range(300):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    body = {"model": ALIAS, "messages": MESSAGES, "max_tokens": 2,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    r = app.send("POST", "/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "json_schema"


def test_llama_server_completion_whole_streamed_and_several_prompts(app: FakeApp):
    r = app.send("POST", "/completion",
                 json={"prompt": "abc", "n_predict": 8, "temperature": 0})
    assert r.status_code == 200
    body = r.json()
    assert body["content"] == expected_text(app, app.server.model.tokenize("abc"), 8)[0]
    assert body["stop"] is True and body["tokens_predicted"] <= 8
    streamed = app.send("POST", "/completion",
                        json={"prompt": "abc", "n_predict": 8, "temperature": 0, "stream": True})
    chunks = [json.loads(d) for _, d in sse_events(streamed.text)]
    assert "[DONE]" not in streamed.text and chunks[-1]["stop"] is True
    assert "".join(c["content"] for c in chunks) == body["content"]
    several = app.send("POST", "/completion", json={"prompt": ["a", "b"], "n_predict": 3})
    assert [item["index"] for item in several.json()] == [0, 1]
    app.check_idle()


def test_tokenize_and_detokenize_round_trip_with_pieces(app: FakeApp):
    text = "héllo <|im_end|> wörld"
    ids = app.send("POST", "/tokenize", json={"content": text}).json()["tokens"]
    assert app.server.model.eos in ids  # parse_special defaults to true
    back = app.send("POST", "/detokenize", json={"tokens": ids}).json()["content"]
    assert back == text
    pieces = app.send("POST", "/tokenize",
                      json={"content": "é", "with_pieces": True}).json()["tokens"]
    assert [p["piece"] for p in pieces] == [[0xC3], [0xA9]]  # half a character each


def test_health_and_slots_report_the_fake_server(app: FakeApp):
    assert app.send("GET", "/health").json() == {"status": "ok"}
    app.send("POST", "/v1/chat/completions", json=CHAT)
    slots = app.send("GET", "/slots").json()
    assert len(slots) == 2 and not any(s["is_processing"] for s in slots)
    assert max(s["cached_tokens"] for s in slots) > 0  # the prompt stays cached
    models = app.send("GET", "/v1/models").json()
    assert models["data"][0]["id"] == ALIAS


def test_routes_the_fake_model_cannot_serve_answer_their_documented_errors(app: FakeApp):
    r = app.send("POST", "/v1/embeddings", json={"input": "hi"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_feature"
    r = app.send("POST", "/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


def test_openai_errors_name_the_field(app: FakeApp):
    r = app.send("POST", "/v1/chat/completions", json={**CHAT, "bogus_field": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "bogus_field"
    r = app.send("POST", "/v1/chat/completions", content=b"{not json",
                 headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]
    app.check_idle()


def test_slot_save_and_restore_round_trip(app: FakeApp):
    app.send("POST", "/v1/chat/completions", json=CHAT)
    slot = max(app.send("GET", "/slots").json(), key=lambda s: s["cached_tokens"])
    saved = app.send("POST", f"/slots/{slot['id']}?action=save", json={"filename": "s.bin"})
    assert saved.status_code == 200 and saved.json()["n_saved"] == slot["cached_tokens"]
    other = 1 - slot["id"]
    restored = app.send("POST", f"/slots/{other}?action=restore", json={"filename": "s.bin"})
    assert restored.json()["n_restored"] == slot["cached_tokens"]
    app.check_idle()


def test_a_build_that_fails_is_a_503_on_health():
    def broken(start: object) -> Hosted:
        raise RuntimeError("no such backend")

    server = Server.hosting(broken, "broken.gguf")
    with TestClient(create_app(server, own_server=True), base_url="http://localhost") as client:
        r = client.get("/health")
        with pytest.raises(LoadFailedError):
            server.fetch_model()
        assert server.try_model() is None
    assert r.status_code == 503 and "no such backend" in r.json()["error"]["message"]


NO_LIBLLAMA = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from fake_http import CHAT, fake_app
    import llamapy._native._loader as loader
    with fake_app() as app:
        for method, path, body in [
                ("POST", "/v1/completions", {{"prompt": "x", "max_tokens": 3}}),
                ("POST", "/completion", {{"prompt": "x", "n_predict": 3, "n_probs": 2}}),
                ("POST", "/tokenize", {{"content": "x", "with_pieces": True}}),
                ("GET", "/slots", None), ("GET", "/metrics", None)]:
            assert app.send(method, path, json=body).status_code == 200, path
        app.check_idle()
    print(loader._native is None, "llamapy._native._llama_ffi" in sys.modules)
""")


def test_serving_on_the_fake_backend_never_loads_libllama():
    """In a fresh interpreter (another test may have loaded it in this one). Chat routes are
    left out: they render and parse through llama.cpp's chat layer, which is native."""
    code = NO_LIBLLAMA.format(tests=str(Path(__file__).parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]
