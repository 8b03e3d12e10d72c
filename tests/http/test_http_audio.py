"""Audio on the real model: SmolLM2-135M with the tiny generated audio projector of
``llamapy.testing.tiny_audio_mmproj_path`` (a Whisper-style encoder: each 30-second window
becomes 750 embeddings), through the official OpenAI client (``input_audio``) and llama-server's
``/completion`` (``multimodal_data``).

Arbitrary weights: this proves that a WAV clip is read, encoded and decoded into the model, that
sending it again reuses its KV, and that bad audio is a 400; not that anything is heard.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from live import LiveApp

from llamapy._paths import sha256_file
from llamapy.media.samples import wav
from llamapy.serve import create_app
from llamapy.server import Server
from llamapy.testing import TINY_AUDIO_MMPROJ_SHA256, tiny_audio_mmproj_path

CLIP = base64.b64encode(wav(0.5, 16000, 440.0)).decode()


@pytest.fixture(scope="module")
def audio(model_path: Path) -> Iterator[LiveApp]:
    server = Server(model_path, mmproj=str(tiny_audio_mmproj_path()), n_ctx=2048, n_parallel=1,
                    n_threads=2)
    server.wait_ready(60)
    with LiveApp(create_app(server, alias="audio", own_server=True)) as app:
        yield app


def listen(client: openai.OpenAI, clip: str = CLIP):
    return client.chat.completions.create(
        model="audio", max_tokens=4, temperature=0,
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "What do you hear?"},
            {"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}}]}])


def test_a_clip_is_heard_and_reused(audio: LiveApp) -> None:
    assert sha256_file(tiny_audio_mmproj_path()) == TINY_AUDIO_MMPROJ_SHA256
    client = openai.OpenAI(base_url=audio.url + "/v1", api_key="x", max_retries=0, timeout=300)
    first = listen(client)
    again = listen(client)
    assert first.usage.prompt_tokens > 750  # the window's embeddings and the text
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content
    with httpx.Client(base_url=audio.url, timeout=300) as http:
        props = http.get("/props").json()
        assert props["modalities"] == {"vision": False, "audio": True, "video": False}
        native = http.post("/completion", json={"n_predict": 2, "prompt": {
            "prompt_string": "Listen: <__media__>", "multimodal_data": [CLIP]}})
        assert native.status_code == 200, native.text
        bad = http.post("/completion", json={"n_predict": 2, "prompt": {
            "prompt_string": "Listen: <__media__>",
            "multimodal_data": [base64.b64encode(b"RIFF\x00\x00\x00\x00WAVEjunk").decode()]}})
        assert bad.status_code == 400
