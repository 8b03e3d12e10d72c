"""Images on the real model: SmolLM2-135M with the tiny generated vision projector of
``llamapy.testing.tiny_mmproj_path`` (every image becomes 16 embeddings), through the official
OpenAI and Anthropic clients and the Responses API, served by uvicorn; and Gemma 3 270M with
a tiny Gemma 3 projector, whose images are decoded whole with bidirectional attention.

The projector's weights are arbitrary (integer hashing, the same bytes on every machine), so
these tests prove the plumbing: an image reaches the model as embeddings and changes its
answer, a conversation that sends the same image again reuses its KV (``cached_tokens``) and
answers the same, another image is not reused, bad media is a 400, and nothing is left
behind. They cannot prove the model sees anything: that needs trained weights.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from live import LiveApp

from llamapy._paths import sha256_file
from llamapy.media.samples import png
from llamapy.models import second_model_path
from llamapy.serve import create_app
from llamapy.server import Server
from llamapy.testing import (
    TINY_GEMMA3_MMPROJ_SHA256,
    TINY_MMPROJ_SHA256,
    tiny_gemma3_mmproj_path,
    tiny_mmproj_path,
)

RED, BLUE = png(24, 24, (220, 20, 20)), png(24, 24, (20, 20, 220))
QUESTION = "What is in this image?"


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


@pytest.fixture(scope="module")
def vision(model_path) -> Iterator[LiveApp]:
    server = Server(model_path, mmproj=str(tiny_mmproj_path()), n_ctx=2048, n_parallel=2,
                    n_threads=1)
    server.wait_ready(60)
    with LiveApp(create_app(server, alias="vision", own_server=True)) as app:
        yield app


@pytest.fixture(scope="module")
def oai(vision: LiveApp) -> openai.OpenAI:
    return openai.OpenAI(base_url=vision.url + "/v1", api_key="x", max_retries=0, timeout=120)


def ask(client: openai.OpenAI, image: bytes, question: str = QUESTION, model: str = "vision"):
    return client.chat.completions.create(
        model=model, max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": [
            {"type": "text", "text": question},
            {"type": "image_url", "image_url": {"url": data_url(image)}}]}])


def test_the_projector_is_the_pinned_one() -> None:
    assert sha256_file(tiny_mmproj_path()) == TINY_MMPROJ_SHA256


def test_openai_client_image_is_reused_when_resent(oai: openai.OpenAI) -> None:
    first = ask(oai, RED)
    again = ask(oai, RED)
    other = ask(oai, BLUE)
    assert first.usage.prompt_tokens >= 16 + 5
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content
    # the image sits after the question: only the text before it may be reused
    assert other.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens - 16


def test_the_image_reaches_the_model(oai: openai.OpenAI) -> None:
    answers = {ask(oai, png(24, 24, (c, 255 - c, 40))).choices[0].message.content
               for c in (0, 90, 180, 255)}
    text_only = oai.chat.completions.create(
        model="vision", max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": QUESTION}]).choices[0].message.content
    assert len(answers | {text_only}) > 1


def test_a_second_turn_keeps_the_image_cached(oai: openai.OpenAI) -> None:
    first = ask(oai, BLUE, "Describe it.")
    turn = [{"role": "user", "content": [
        {"type": "text", "text": "Describe it."},
        {"type": "image_url", "image_url": {"url": data_url(BLUE)}}]},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And the colour?"}]
    second = oai.chat.completions.create(model="vision", max_tokens=4, temperature=0,
                                         messages=turn)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_anthropic_client_image(vision: LiveApp) -> None:
    client = anthropic.Anthropic(base_url=vision.url, api_key="x", max_retries=0)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(RED).decode()}}
    messages = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, block]}]
    first = client.messages.create(model="vision", max_tokens=6, messages=messages,
                                   extra_body={"temperature": 0})
    again = client.messages.create(model="vision", max_tokens=6, messages=messages,
                                   extra_body={"temperature": 0})
    assert first.usage.input_tokens >= 16
    assert again.usage.cache_read_input_tokens > 16
    assert again.content[0].text == first.content[0].text
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="vision", max_tokens=6, messages=[
            {"role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png",
                "data": base64.b64encode(b"nope").decode()}}]}])


def test_responses_input_image(oai: openai.OpenAI) -> None:
    content = [{"type": "input_text", "text": QUESTION},
               {"type": "input_image", "image_url": data_url(BLUE)}]
    request = {"model": "vision", "max_output_tokens": 6, "temperature": 0,
               "input": [{"role": "user", "content": content}]}
    first = oai.responses.create(**request)
    again = oai.responses.create(**request)
    assert again.usage.input_tokens_details.cached_tokens > 16
    assert again.output_text == first.output_text


def test_bad_media_is_refused_and_the_server_goes_on(vision: LiveApp,
                                                     oai: openai.OpenAI) -> None:
    bad = [data_url(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40),  # a PNG header with nothing after
           data_url(png(2, 2)[:40]),  # truncated after its header
           "http://127.0.0.1:9/x.png"]
    for url in bad:
        with pytest.raises(openai.BadRequestError):
            oai.chat.completions.create(model="vision", max_tokens=2, messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
    assert ask(oai, RED).usage.completion_tokens > 0
    props = httpx.get(vision.url + "/props").json()
    assert props["modalities"]["vision"] is True


def test_embeddings_with_an_image(vision: LiveApp) -> None:
    """llama-server's multimodal embeddings: ``multimodal_data`` with a ``prompt_string``, or
    image parts in ``content``; the same image gives the same vector in both shapes, the text
    alone another, and media that is not an image is a 400."""
    image = base64.b64encode(RED).decode()
    with httpx.Client(base_url=vision.url, timeout=120) as http:
        native = http.post("/embeddings", json={"content": [
            {"prompt_string": "What is this: <__media__>\n", "multimodal_data": [image]},
            {"prompt_string": "What is this: <__media__>\n", "multimodal_data": [image]},
            {"prompt_string": "What is this: <__media__>\n"}]})
        assert native.status_code == 200, native.text
        rows = [item["embedding"][0] for item in native.json()]
        assert rows[0] == rows[1] and rows[0] != rows[2]
        parts = {"content": [{"type": "text", "text": "What is this: "},
                             {"type": "image_url", "image_url": {"url": data_url(RED)}},
                             {"type": "text", "text": "\n"}]}
        oai = http.post("/v1/embeddings", json={"input": [parts]})
        assert oai.status_code == 200, oai.text
        assert oai.json()["data"][0]["embedding"] == pytest.approx(rows[0], abs=1e-5)
        bad = http.post("/embeddings", json={"content": [
            {"prompt_string": "What is this: <__media__>\n", "multimodal_data": ["bWFsZm9y"]}]})
        assert bad.status_code == 400


@pytest.fixture(scope="module")
def gemma3_vision() -> Iterator[LiveApp]:
    """Gemma 3 270M with the tiny Gemma 3 projector: its images are 4 rows decoded together
    with bidirectional attention (``chunk_size`` 2: a chunk that small still takes them
    whole)."""
    server = Server(second_model_path(), mmproj=str(tiny_gemma3_mmproj_path()), n_ctx=1024,
                    n_parallel=1, chunk_size=2, n_threads=1)
    server.wait_ready(60)
    with LiveApp(create_app(server, alias="gemma3", own_server=True)) as app:
        yield app


def test_gemma3_images_are_decoded_whole_and_reused(gemma3_vision: LiveApp) -> None:
    client = openai.OpenAI(base_url=gemma3_vision.url + "/v1", api_key="x", max_retries=0,
                           timeout=120)
    first = ask(client, RED, model="gemma3")
    again = ask(client, RED, model="gemma3")
    other = ask(client, BLUE, model="gemma3")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content
    assert other.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens - 4
    assert sha256_file(tiny_gemma3_mmproj_path()) == TINY_GEMMA3_MMPROJ_SHA256


def test_an_image_a_tool_returned_reaches_the_model(oai: openai.OpenAI) -> None:
    """As Codex's ``view_image`` returns one: the image in ``function_call_output`` is seen
    (a different image, a different answer's prompt; the same image, its KV reused)."""
    def call(image: bytes) -> dict:
        return {"model": "vision", "max_output_tokens": 6, "temperature": 0, "input": [
            {"role": "user", "content": "Look at a.png."},
            {"type": "function_call", "call_id": "c1", "name": "view_image",
             "arguments": '{"path": "a.png"}'},
            {"type": "function_call_output", "call_id": "c1", "output": [
                {"type": "input_text", "text": "a.png:"},
                {"type": "input_image", "image_url": data_url(image)}]}]}
    first = oai.responses.create(**call(BLUE))
    again = oai.responses.create(**call(BLUE))
    assert again.usage.input_tokens_details.cached_tokens > 16
    assert again.output_text == first.output_text
    other = oai.responses.create(**call(RED))
    assert other.usage.input_tokens_details.cached_tokens < again.usage.input_tokens - 8
