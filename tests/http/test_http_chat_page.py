"""The chat page in a real headless Chromium (see :mod:`browser_page`): a streamed conversation
with its stats, reasoning apart, Markdown with highlighted code, model HTML shown as text,
stop, and conversations that survive a reload."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import browser_page
import httpx
import pytest
from browser_page import ask, setting
from http_helpers import wait_slots_free
from live import LiveApp

pytestmark = browser_page.pytestmark

#: The budget of the generation the test stops.
LONG_BUDGET = 900


@pytest.fixture(scope="module")
def page(live: LiveApp) -> Iterator[Any]:
    """A fresh page on the chat UI."""
    with browser_page.browser_page(live.url + "/") as page:
        yield page


def grammar_answer(page: Any, text: str, max_tokens: int = 80) -> None:
    """Make the next answers exactly ``text`` (a grammar), whatever the model would say."""
    setting(page, "#extra", json.dumps({"grammar": "root ::= " + json.dumps(text)}))
    setting(page, "#max-tokens", str(max_tokens))


def test_page_streams_a_conversation_with_tokens_per_second(page: Any) -> None:
    page.wait_for_function("document.querySelector('#model').textContent.includes('smol')")
    assert page.is_hidden("#attach-label")  # a model without a projector takes no images
    setting(page, "#max-tokens", "12")
    first = ask(page, "Say hello.")
    assert first.locator(".content").inner_text().strip()
    assert first.locator(".reasoning").is_hidden()
    stats = page.inner_text("#stats")
    assert "tokens/s" in stats and 0 < int(stats.split()[0]) <= 12
    assert "TTFT" in first.locator(".msg-stats").inner_text()
    second = ask(page, "And goodbye?")
    assert second.locator(".content").inner_text().strip()
    assert page.locator(".msg.user").count() == 2
    assert page.locator(".msg.error").count() == 0
    assert "cached" in second.locator(".msg-stats").inner_text()  # the first turn's KV


def test_page_shows_reasoning_separately(page: Any, live: LiveApp, thinking: LiveApp) -> None:
    """On an app whose template shows reasoning (its format then reads ``<think>``): the
    module's page goes there, then back."""
    page.goto(thinking.url + "/")
    try:
        page_shows_reasoning(page)
    finally:
        page.goto(live.url + "/")


def page_shows_reasoning(page: Any) -> None:
    grammar = r'root ::= "<think>\nLet me think.\n</think>\n\n" "Hi" [a-z !]{0,8}'
    setting(page, "#extra", json.dumps({"grammar": grammar}))
    setting(page, "#max-tokens", "40")
    bubble = ask(page, "Greet me.")
    assert bubble.locator(".reasoning").is_visible()
    assert bubble.locator(".reasoning-text").text_content().strip() == "Let me think."  # collapsed
    content = bubble.locator(".content").inner_text()
    assert content.startswith("Hi") and "think" not in content
    setting(page, "#extra", "{}")


def test_an_answer_renders_as_markdown_with_a_highlighted_code_block(page: Any) -> None:
    page.click("#clear")
    grammar_answer(page, "Use this:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\n"
                         "It **adds** them.")
    bubble = ask(page, "Write an add function.")
    assert bubble.locator(".content strong").inner_text() == "adds"
    code = bubble.locator(".content pre code")
    assert code.inner_text().startswith("def add(a, b):")
    assert code.locator(".hljs-keyword").first.inner_text() == "def"
    assert bubble.locator(".code-lang").inner_text() == "python"
    bubble.locator(".code-bar .copy").click()
    page.wait_for_function("navigator.clipboard.readText().then(t => t.startsWith('def add'))")
    setting(page, "#extra", "{}")


def test_html_in_an_answer_is_shown_as_text(page: Any) -> None:
    page.click("#clear")
    grammar_answer(page, 'Look: <img src="x" onerror="window.pwned=1"> <b>bold?</b> '
                         '<script>window.pwned=2</script>')
    bubble = ask(page, "Say something.")
    content = bubble.locator(".content")
    assert content.locator("img, script, b").count() == 0
    assert "<b>bold?</b>" in content.inner_text()
    assert page.evaluate("window.pwned") is None
    setting(page, "#extra", "{}")


def test_stop_ends_a_long_generation_early(page: Any, http: httpx.Client) -> None:
    page.click("#clear")
    setting(page, "#extra", json.dumps({"ignore_eos": True}))
    setting(page, "#max-tokens", str(LONG_BUDGET))
    page.fill("#input", "Count from one to one thousand.")
    page.click("#send")
    page.wait_for_function(
        "Number(document.querySelector('.msg.assistant')?.dataset.tokens) >= 3")
    page.click("#stop")
    bubble = browser_page.wait_answer(page, 0)
    assert bubble.get_attribute("data-stopped") == "true"
    assert 3 <= int(bubble.get_attribute("data-tokens")) < LONG_BUDGET
    assert "stopped" in bubble.locator(".msg-stats").inner_text()
    assert page.is_enabled("#send")
    wait_slots_free(http)  # stopping cancelled the request on the server
    setting(page, "#extra", "{}")


def test_a_conversation_survives_a_reload(page: Any) -> None:
    page.click("#clear")
    setting(page, "#max-tokens", "8")
    setting(page, "#system", "You are terse.")
    ask(page, "Remember the word pineapple.")
    current = page.locator(".conv[aria-current]")
    conv_id = current.get_attribute("data-id")
    assert current.inner_text().startswith("Remember the word pineapple.")
    page.reload()
    page.wait_for_selector(f'.conv[data-id="{conv_id}"][aria-current]')
    assert page.inner_text(".msg.user .content") == "Remember the word pineapple."
    assert page.locator(".msg.assistant").count() == 1
    assert "tokens" in page.inner_text(".msg.assistant .msg-stats")
    assert page.input_value("#system") == "You are terse."  # the conversation's own settings
    setting(page, "#system", "")


def test_the_pages_run_under_their_csp(page: Any, live: LiveApp) -> None:
    """The chat page answers (Markdown, sanitiser, highlighter) and the live view shows the
    slots with the pages' Content-Security-Policy enforced, and the browser reports no
    violation (waits on locators only: a predicate string would itself be refused)."""
    with browser_page.csp_page(page.context.browser, live.url + "/") as (strict, violations):
        strict.locator("#model", has_text="smol").wait_for()
        setting(strict, "#max-tokens", "8")
        strict.fill("#input", "Say hello.")
        strict.click("#send")
        strict.locator(".msg.assistant[data-done='true']").first.wait_for()
        strict.goto(live.url + "/dashboard")
        strict.locator(".slot").nth(3).wait_for()
    assert violations == []
