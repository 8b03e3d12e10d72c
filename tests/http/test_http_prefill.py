"""Assistant prefill / ``continue_final_message``: a conversation ending with an assistant
message is continued inside that message (llama-server's default, Anthropic's prefill, vLLM's
flag), ``--no-prefill-assistant`` answers it in a new turn, and the invalid combinations are
llama-server's 400s."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import pytest
from http_helpers import MODEL_ALIAS
from live import LiveApp

from llamapy.serve import create_app
from llamapy.server import Server

PREFIX = "The capital of France is"
TURN = [{"role": "user", "content": "Name the capital of France."},
        {"role": "assistant", "content": PREFIX}]


def rendered(http: httpx.Client, **extra: object) -> str:
    done = http.post("/apply-template", json={"messages": TURN, **extra})
    assert done.status_code == 200, done.text
    return done.json()["prompt"]


def test_a_final_assistant_message_is_continued(http: httpx.Client) -> None:
    prompt = rendered(http)
    assert prompt.endswith(f"<|im_start|>assistant\n{PREFIX}")
    assert rendered(http, continue_final_message=True) == prompt
    assert rendered(http, continue_final_message="content") == prompt
    closed = rendered(http, continue_final_message=False, add_generation_prompt=False)
    assert closed.rstrip().endswith("<|im_end|>") and PREFIX in closed


def test_the_continuation_is_only_the_new_text(http: httpx.Client) -> None:
    done = http.post("/v1/chat/completions", json={
        "model": MODEL_ALIAS, "messages": TURN, "max_tokens": 6, "temperature": 0})
    assert done.status_code == 200, done.text
    text = done.json()["choices"][0]["message"]["content"]
    assert text and PREFIX not in text and "assistant" not in text
    assert "paris" in text.lower()


def test_anthropic_prefill_continues(live: LiveApp) -> None:
    claude = anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0)
    reply = claude.messages.create(model=MODEL_ALIAS, max_tokens=6, extra_body={"temperature": 0},
                                   messages=TURN)  # type: ignore[arg-type]
    text = "".join(b.text for b in reply.content if b.type == "text")
    assert "paris" in text.lower() and PREFIX not in text


@pytest.mark.parametrize(("messages", "extra", "says"), [
    ([*TURN, {"role": "assistant", "content": "x"}], {}, "2 or more assistant messages"),
    (TURN, {"continue_final_message": True, "add_generation_prompt": True},
     "Cannot set both"),
    (TURN[:1], {"continue_final_message": True}, "needs a final assistant message"),
    ([TURN[0], {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
     {}, "tool calls"),
    (TURN, {"continue_final_message": "sometimes"}, "continue_final_message"),
])
def test_invalid_continuations_are_400(http: httpx.Client, messages: list, extra: dict,
                                       says: str) -> None:
    bad = http.post("/v1/chat/completions", json={"model": MODEL_ALIAS, "messages": messages,
                                                  "max_tokens": 2, **extra})
    assert bad.status_code == 400, bad.text
    assert says in bad.json()["error"]["message"]


@pytest.fixture(scope="module")
def no_prefill(server: Server) -> Iterator[httpx.Client]:
    with LiveApp(create_app(server, alias=MODEL_ALIAS, prefill_assistant=False)) as app, \
            httpx.Client(base_url=app.url, timeout=60) as client:
        yield client


def test_no_prefill_assistant_answers_in_a_new_turn(no_prefill: httpx.Client) -> None:
    prompt = rendered(no_prefill)
    assert prompt.endswith("<|im_start|>assistant\n") and f"{PREFIX}<|im_end|>" in prompt
    assert rendered(no_prefill, continue_final_message=True).endswith(PREFIX)


#: A template that never shows an assistant message's text: the prompt cannot end inside it.
DROPPING = ("{% for m in messages %}<{{ m.role }}>{% if m.role != 'assistant' %}{{ m.content }}"
            "{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def dropping(server: Server) -> Iterator[httpx.Client]:
    with LiveApp(create_app(server, alias=MODEL_ALIAS, chat_template=DROPPING)) as app, \
            httpx.Client(base_url=app.url, timeout=60) as client:
        yield client


def test_a_template_that_drops_the_text_continues_after_a_new_turn(
        dropping: httpx.Client) -> None:
    """llama.cpp's chat layer renders the messages before the continued one, then the
    template's generation prompt and the message's text (so what a template does with an
    assistant message's text does not matter); the answer is only the new text."""
    expected = f"<user>{TURN[0]['content']}<assistant>{PREFIX}"
    assert rendered(dropping) == expected
    assert rendered(dropping, continue_final_message="content") == expected
    done = dropping.post("/v1/chat/completions", json={
        "model": MODEL_ALIAS, "messages": TURN, "max_tokens": 4, "temperature": 0})
    assert done.status_code == 200, done.text
    text = done.json()["choices"][0]["message"]["content"]
    assert PREFIX not in text and "paris" in text.lower()
