"""Headless Chromium for the page tests (Debian's ``chromium``, driven by Playwright).

``.ci/run`` installs chromium and sets ``LLAMAPY_REQUIRE_BROWSER=1``, so there a missing browser
fails the run; elsewhere (a developer machine without chromium) the page tests are skipped.
A page test module sets ``pytestmark = browser_page.pytestmark``. Waits are on DOM state with
generous timeouts (a busy 2-core machine), never sleeps.

The pages send a Content-Security-Policy without ``'unsafe-eval'``, which also blocks
Playwright's ``wait_for_function`` predicates (evaluated from strings in the page); the test
contexts therefore bypass the CSP, and :func:`csp_page` (enforced, every violation recorded)
serves the test that the pages themselves run under it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

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
#: Milliseconds the page may take for one answer or one change of the live view.
ANSWER_TIMEOUT_MS = 60_000

if REQUIRED and CHROMIUM is None:
    raise RuntimeError("LLAMAPY_REQUIRE_BROWSER=1 but no chromium was found")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


@contextmanager
def browser_page(url: str) -> Iterator[Any]:
    """A page on ``url`` in a fresh browser (clipboard allowed, a desktop-sized viewport)."""
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            with another_page(browser, url) as page:
                yield page
        finally:
            browser.close()


@contextmanager
def another_page(browser: Any, url: str, *, enforce_csp: bool = False) -> Iterator[Any]:
    """A page on ``url`` in a context of its own (its own storage) of ``browser`` (one
    Playwright per thread: a test that already has a page opens more with this)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900},
                                  permissions=["clipboard-read", "clipboard-write"],
                                  bypass_csp=not enforce_csp)
    try:
        context.set_default_timeout(ANSWER_TIMEOUT_MS)
        page = context.new_page()
        page.goto(url)
        yield page
    finally:
        context.close()


@contextmanager
def csp_page(browser: Any, url: str) -> Iterator[tuple[Any, list[str]]]:
    """A page of ``browser`` on ``url`` with its CSP enforced, and the list its violations are
    recorded in (the browser reports each on the console)."""
    violations: list[str] = []
    with another_page(browser, "about:blank", enforce_csp=True) as page:
        page.on("console", lambda m: violations.append(m.text)
                if "Content Security Policy" in m.text else None)
        page.goto(url)
        yield page, violations


def setting(page: Any, selector: str, value: str) -> None:
    """Set a field of the chat's settings panel (opened if need be) as a user would."""
    if page.is_hidden("#settings"):
        page.click("#toggle-settings")
    page.fill(selector, value)
    page.dispatch_event(selector, "change")


def ask(page: Any, text: str) -> Any:
    """Send ``text`` and wait for the assistant's answer to finish; return its bubble."""
    before = page.locator(".msg.assistant").count()
    page.fill("#input", text)
    page.click("#send")
    return wait_answer(page, before)


def wait_answer(page: Any, index: int) -> Any:
    """Wait until the ``index``-th assistant bubble exists and is done; return it."""
    page.wait_for_function(
        "n => document.querySelectorAll('.msg.assistant')[n]?.dataset.done === 'true'",
        arg=index, timeout=ANSWER_TIMEOUT_MS)
    return page.locator(".msg.assistant").nth(index)
