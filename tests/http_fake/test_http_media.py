"""Images (and audio) on every API, on the fake server and its fake projector: each API's
media shape reaches the engine as media, a resent image reuses its KV and another does not,
and bad media is a 400 in the API's own error shape with nothing left behind."""

from __future__ import annotations

import base64
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_http import FakeApp

from llamapy.errors import MediaError
from llamapy.media.remote import FETCH_FAILED
from llamapy.media.samples import png, wav
from llamapy.media.sources import MediaFetch, media_from_url

RED, BLUE = png(8, 8, (255, 0, 0)), png(8, 8, (0, 0, 255))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


def openai_chat(image: bytes | str, text: str = "what is this?") -> dict:
    url = image if isinstance(image, str) else data_url(image)
    return {"messages": [{"role": "user", "content": [
        {"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]}],
        "max_tokens": 4, "temperature": 0}


@pytest.fixture
def app():
    with FakeApp(options={"mmproj": "fake-audio"}) as fake:
        yield fake


def chat(app: FakeApp, body: dict) -> dict:
    response = app.send("POST", "/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_resent_image_is_reused_and_another_is_not(app: FakeApp) -> None:
    first = chat(app, openai_chat(RED))
    again = chat(app, openai_chat(RED))
    other = chat(app, openai_chat(BLUE))
    prompt = first["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt - 1
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] < prompt - 4
    assert again["choices"][0]["message"] == first["choices"][0]["message"]
    app.check_idle()


def test_the_image_changes_the_answer(app: FakeApp) -> None:
    answers = {chat(app, openai_chat(png(8, 8, (c, 0, 0))))["choices"][0]["message"]["content"]
               for c in range(0, 250, 50)}
    assert len(answers) > 1
    app.check_idle()


def test_input_audio_is_taken_by_an_audio_projector(app: FakeApp) -> None:
    body = {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": b64(wav(0.1)), "format": "wav"}},
        {"type": "text", "text": "transcribe"}]}], "max_tokens": 3}
    assert chat(app, body)["usage"]["completion_tokens"] == 3


def test_anthropic_image_blocks_and_tool_results(app: FakeApp) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": b64(RED)}}
    body = {"model": "fake", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "see"}, image]}]}
    first = app.send("POST", "/v1/messages", json=body)
    assert first.status_code == 200, first.text
    again = app.send("POST", "/v1/messages", json=body).json()
    assert again["usage"]["cache_read_input_tokens"] > 0
    tool_turns = {"model": "fake", "max_tokens": 4, "messages": [
        {"role": "user", "content": "take a screenshot"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "here"}, image]}]}]}
    assert app.send("POST", "/v1/messages", json=tool_turns).status_code == 200
    bad = {**body, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "!!!"}}]}]}
    refused = app.send("POST", "/v1/messages", json=bad)
    assert refused.status_code == 400
    assert refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "invalid_request_error"


def test_responses_input_image(app: FakeApp) -> None:
    body = {"model": "fake", "max_output_tokens": 4, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what?"},
        {"type": "input_image", "image_url": data_url(RED)}]}]}
    first = app.send("POST", "/v1/responses", json=body)
    assert first.status_code == 200, first.text
    again = app.send("POST", "/v1/responses", json=body).json()
    assert again["usage"]["input_tokens_details"]["cached_tokens"] > 0


def test_completion_multimodal_data(app: FakeApp) -> None:
    body = {"prompt": {"prompt_string": "look: <__media__> and say", "multimodal_data":
                       [b64(RED)]}, "n_predict": 3}
    response = app.send("POST", "/completion", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["tokens_predicted"] == 3
    wrong = {"prompt": {"prompt_string": "no marker", "multimodal_data": [b64(RED)]}}
    assert app.send("POST", "/completion", json=wrong).status_code == 400


def test_ollama_images(app: FakeApp) -> None:
    body = {"model": "fake", "stream": False, "messages": [
        {"role": "user", "content": "what?", "images": [b64(RED)]}],
        "options": {"num_predict": 3}}
    response = app.send("POST", "/api/chat", json=body)
    assert response.status_code == 200, response.text
    generate = {"model": "fake", "stream": False, "prompt": "what?", "images": [b64(BLUE)],
                "options": {"num_predict": 3}}
    assert app.send("POST", "/api/generate", json=generate).status_code == 200
    show = app.send("POST", "/api/show", json={"model": "fake"}).json()
    assert "vision" in show["capabilities"]


def test_props_and_models_report_the_modalities(app: FakeApp) -> None:
    props = app.send("GET", "/props").json()
    assert props["modalities"] == {"vision": True, "audio": True, "video": False}
    assert props["media_marker"] == "<__media__>"
    models = app.send("GET", "/v1/models").json()
    assert "multimodal" in models["data"][0]["capabilities"]


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1:9/cat.png", "remote"),
    ("data:image/png;base64,@@@@", "base64"),
    ("data:image/png,rawtext", "data URL"),
    (data_url(b"GIF89a" + b"\x00" * 4), "truncated"),
    (data_url(b"not an image at all"), "unsupported"),
    (data_url(png(9000, 9000)[:64]), "pixels"),
])
def test_bad_media_is_a_400(app: FakeApp, url: str, why: str) -> None:
    response = app.send("POST", "/v1/chat/completions", json=openai_chat(url))
    assert response.status_code == 400, (why, response.text)
    assert response.json()["error"]["type"] == "invalid_request_error"
    app.check_idle()


def test_too_many_and_too_large_media() -> None:
    with FakeApp(options={"mmproj": "fake", "max_media_items": 2,
                          "max_media_bytes": 200}) as app:
        body = openai_chat(RED)
        body["messages"][0]["content"] += [{"type": "image_url",
                                            "image_url": {"url": data_url(RED)}}] * 2
        assert app.send("POST", "/v1/chat/completions", json=body).status_code == 400
        big = openai_chat(png(64, 64, (1, 2, 3)) + b"\x00" * 300)
        assert app.send("POST", "/v1/chat/completions", json=big).status_code == 400
        assert app.send("POST", "/v1/chat/completions", json=openai_chat(RED)).status_code \
            == 200
        app.check_idle()


def test_a_model_without_a_projector_refuses_media() -> None:
    with FakeApp() as app:
        response = app.send("POST", "/v1/chat/completions", json=openai_chat(RED))
        assert response.status_code == 400
        assert "--mmproj" in response.json()["error"]["message"]
        assert app.send("GET", "/props").json()["modalities"]["vision"] is False


def test_audio_is_refused_by_a_vision_projector() -> None:
    with FakeApp(options={"mmproj": "fake"}) as app:
        body = {"messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": b64(wav(0.1)), "format": "wav"}}]}]}
        response = app.send("POST", "/v1/chat/completions", json=body)
        assert response.status_code == 400
        assert "audio" in response.json()["error"]["message"]


class _StandIn(http.server.BaseHTTPRequestHandler):
    """A local stand-in for remote image hosts: an image, a 404, an oversized body and a
    slow drip."""

    def do_GET(self) -> None:
        if self.path == "/red.png":
            self._send(200, RED)
        elif self.path == "/big.png":
            self._send(200, RED + b"\x00" * 5000)
        elif self.path == "/slow.png":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b"\x00" * 10)
                self.wfile.flush()
                time.sleep(0.05)
        else:
            self._send(404, b"no")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture(scope="module")
def stand_in() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_remote_and_local_image_urls_when_the_server_allows_them(stand_in: str,
                                                                 tmp_path: Path) -> None:
    (tmp_path / "red.png").write_bytes(RED)
    with FakeApp(options={"mmproj": "fake", "max_media_bytes": 4000},
                 app_options={"media_remote": True, "media_remote_private": True,
                              "media_path": str(tmp_path)}) as app:
        for url in (f"{stand_in}/red.png", "file://red.png", f"file://{tmp_path / 'red.png'}",
                    b64(RED)):
            answer = app.send("POST", "/v1/chat/completions", json=openai_chat(url))
            assert answer.status_code == 200, (url, answer.text)
        for url in (f"{stand_in}/missing.png", f"{stand_in}/big.png", "file://../x.png",
                    "file:///etc/hostname", "file://red\x00.png", "file://nothing.png"):
            answer = app.send("POST", "/v1/chat/completions", json=openai_chat(url))
            assert answer.status_code == 400, (url, answer.text)
        app.check_idle()


def test_remote_urls_are_refused_by_default(stand_in: str) -> None:
    with FakeApp(options={"mmproj": "fake"}) as app:
        for url in (f"{stand_in}/red.png", "file://red.png"):
            answer = app.send("POST", "/v1/chat/completions", json=openai_chat(url))
            assert answer.status_code == 400
            assert "media" in answer.json()["error"]["message"]


def test_a_slow_remote_image_is_cut_at_the_time_limit(stand_in: str) -> None:
    started = time.monotonic()
    with pytest.raises(MediaError, match=FETCH_FAILED):
        media_from_url(f"{stand_in}/slow.png",
                       MediaFetch(10_000, remote=True, timeout_s=0.5, private=True), "image")
    assert time.monotonic() - started < 3


def test_the_media_limit_counts_every_prompt_of_a_request() -> None:
    with FakeApp(options={"mmproj": "fake", "max_media_items": 1}) as app:
        one = {"prompt_string": "a <__media__> b", "multimodal_data": [b64(RED)]}
        assert app.send("POST", "/completion", json={"prompt": one, "n_predict": 1}
                        ).status_code == 200
        both = app.send("POST", "/completion", json={"prompt": [one, one], "n_predict": 1})
        assert both.status_code == 400 and "at most 1" in both.json()["error"]["message"]
        app.check_idle()


def test_a_remote_image_trickling_its_headers_is_cut_at_the_time_limit() -> None:
    """A server that sends its headers a byte at a time: the limit is on the whole download,
    not on each read."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1024)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n":
                try:
                    conn.send(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.2)

    threading.Thread(target=trickle, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(MediaError, match=FETCH_FAILED):
        media_from_url(f"http://127.0.0.1:{listener.getsockname()[1]}/x.png",
                       MediaFetch(10_000, remote=True, timeout_s=0.6, private=True), "image")
    assert time.monotonic() - started < 2
    listener.close()


def test_an_anthropic_cache_breakpoint_after_an_image_is_kept() -> None:
    """The breakpoint's prefix is rendered with its image (not dropped as unrenderable)."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": b64(BLUE)}}
    marked = {"type": "text", "text": "remember this " * 20, "cache_control": {"type": "ephemeral"}}
    body = {"model": "fake", "max_tokens": 2, "messages": [
        {"role": "user", "content": [image, marked]},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and now?"}]}
    with FakeApp(options={"mmproj": "fake", "prompt_cache_ram_mb": 64}) as app:
        first = app.send("POST", "/v1/messages", json=body)
        assert first.status_code == 200, first.text
        assert first.json()["usage"]["cache_creation_input_tokens"] > 200


def test_a_slot_holding_an_image_cannot_be_saved(tmp_path: Path) -> None:
    with FakeApp(slot_folder=tmp_path, options={"mmproj": "fake"}) as app:
        assert app.send("POST", "/v1/chat/completions", json=openai_chat(RED)).status_code \
            == 200
        app.check_idle()
        answers = [app.send("POST", f"/slots/{i}", params={"action": "save"},
                            json={"filename": f"s{i}.bin"}) for i in (0, 1)]
        assert sorted(a.status_code for a in answers) == [200, 400]  # the other slot is empty
        refused = next(a for a in answers if a.status_code == 400)
        assert "image" in refused.json()["error"]["message"]


def test_image_bombs_are_refused_from_their_headers(app: FakeApp) -> None:
    """A PNG whose data inflates past its header's size, and a JPEG of hundreds of scans, are
    400s before any decoder runs."""
    import struct
    import zlib

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    inflating = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
                 + chunk(b"IDAT", zlib.compress(b"\x00" * 20_000_000, 9)) + chunk(b"IEND", b""))
    frame = b"\xff\xc2" + struct.pack(">HBHHB", 11, 8, 10, 10, 1) + b"\x01\x11\x00"
    scans = b"\xff\xd8" + frame + b"\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00" * 500 + b"\xff\xd9"
    for bomb in (inflating, scans):
        answer = app.send("POST", "/v1/chat/completions", json=openai_chat(data_url(bomb)))
        assert answer.status_code == 400, answer.text
        assert "refused" in answer.json()["error"]["message"]


def test_apply_template_shows_the_media_marker(app: FakeApp) -> None:
    answer = app.send("POST", "/apply-template", json=openai_chat(RED, "what is this?"))
    assert answer.status_code == 200, answer.text
    assert "what is this?<__media__><" in answer.json()["prompt"]  # joined as llama-server joins


def test_remote_urls_reach_public_addresses_only(stand_in: str) -> None:
    """With --media-remote alone, a URL on a loopback or private address (or a name that
    resolves to one) is refused before anything is sent (more in test_http_media_remote)."""
    fetch = MediaFetch(10_000, remote=True)
    port = stand_in.rsplit(":", 1)[1]
    for url in (f"{stand_in}/red.png", f"http://localhost:{port}/red.png",
                "http://10.1.2.3/x.png", "http://169.254.169.254/latest/meta-data"):
        with pytest.raises(MediaError, match=FETCH_FAILED):
            media_from_url(url, fetch, "image")
    assert media_from_url(f"{stand_in}/red.png", MediaFetch(10_000, remote=True, private=True),
                          "image") == RED
