"""The chat page in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

``.ci/run`` installs chromium and sets ``LLAMAPY_REQUIRE_BROWSER=1``, so there a missing browser
fails the run; elsewhere (a developer machine without chromium) the test is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from live import LiveApp

REQUIRED = os.environ.get("LLAMAPY_REQUIRE_BROWSER") == "1"
if REQUIRED:
    import playwright.sync_api as playwright_api
else:
    playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = os.environ.get("LLAMAPY_CHROMIUM") or shutil.which("chromium") \
    or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
#: Milliseconds the page may take for one answer.
ANSWER_TIMEOUT_MS = 60_000

if REQUIRED and CHROMIUM is None:
    raise RuntimeError("LLAMAPY_REQUIRE_BROWSER=1 but no chromium was found")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


@pytest.fixture(scope="module")
def page(live: LiveApp) -> Iterator[Any]:
    """A fresh page on the chat UI."""
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(live.url + "/")
            yield page
        finally:
            browser.close()


def ask(page: Any, text: str) -> Any:
    """Send ``text`` and wait for the assistant's answer to finish; return its bubble."""
    before = page.locator(".msg.assistant").count()
    page.fill("#input", text)
    page.click("#send")
    bubble = page.locator(".msg.assistant").nth(before)
    bubble.wait_for()
    page.wait_for_function(
        "n => document.querySelectorAll('.msg.assistant')[n]?.dataset.done === 'true'",
        arg=before, timeout=ANSWER_TIMEOUT_MS)
    return bubble


def test_page_streams_a_conversation_with_tokens_per_second(page: Any) -> None:
    page.wait_for_function("document.querySelector('#model').textContent.includes('smol')")
    page.fill("#max-tokens", "12")
    page.dispatch_event("#max-tokens", "change")
    first = ask(page, "Say hello.")
    assert first.locator(".content").inner_text().strip()
    assert first.locator(".reasoning").is_hidden()
    stats = page.inner_text("#stats")
    assert "tokens/s" in stats and 0 < int(stats.split()[0]) <= 12
    second = ask(page, "And goodbye?")
    assert second.locator(".content").inner_text().strip()
    assert page.locator(".msg.user").count() == 2
    assert page.locator(".msg.error").count() == 0


def test_page_shows_reasoning_separately(page: Any) -> None:
    page.click("#clear")
    page.click("#toggle-settings")
    grammar = r'root ::= "<think>\nLet me think.\n</think>\n\n" "Hi" [a-z !]{0,8}'
    page.fill("#extra", json.dumps({"grammar": grammar}))
    page.dispatch_event("#extra", "change")
    page.fill("#max-tokens", "40")
    page.dispatch_event("#max-tokens", "change")
    bubble = ask(page, "Greet me.")
    assert bubble.locator(".reasoning").is_visible()
    assert bubble.locator(".reasoning-text").text_content() == "Let me think."  # collapsed
    content = bubble.locator(".content").inner_text()
    assert content.startswith("Hi") and "think" not in content
    page.fill("#extra", "{}")
    page.dispatch_event("#extra", "change")
