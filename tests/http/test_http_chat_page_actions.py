"""The chat page's actions in a real headless Chromium (see :mod:`browser_page`): regenerate,
edit-and-branch, rename, export / delete / import, and an API key kept for the tab only with
the server's error shown inline."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import browser_page
import httpx
import pytest
from browser_page import ask, setting, wait_answer
from http_helpers import MODEL_ALIAS
from live import LiveApp

from llamapy.serve import create_app
from llamapy.server import ModelManager, ModelSpec, Server

pytestmark = browser_page.pytestmark


@pytest.fixture(scope="module")
def page(live: LiveApp) -> Iterator[Any]:
    """A fresh page on the chat UI, answers capped short."""
    with browser_page.browser_page(live.url + "/") as page:
        page.wait_for_function("document.querySelector('#model').textContent.includes('smol')")
        setting(page, "#max-tokens", "6")
        yield page


def conversations(page: Any) -> list[str]:
    return [t.strip() for t in page.locator(".conv .conv-open").all_inner_texts()]


def test_regenerate_replaces_the_last_answer(page: Any) -> None:
    page.click("#clear")
    ask(page, "Name a colour.")
    page.hover(".msg.assistant")
    page.click(".msg.assistant .act-regenerate")
    wait_answer(page, 0)
    assert page.locator(".msg.assistant").count() == 1
    assert page.locator(".msg.user").count() == 1
    assert page.locator(".msg.assistant .msg-stats").inner_text()


def test_editing_a_message_branches_a_new_conversation(page: Any) -> None:
    page.click("#clear")
    ask(page, "Name a fruit.")
    ask(page, "Name a vegetable.")
    original = page.get_attribute(".conv[aria-current]", "data-id")
    first = page.locator(".msg.user").first
    first.hover()
    first.locator(".act-edit").click()
    first.locator(".edit-box").fill("Name a tree.")
    first.locator(".act-send").click()
    wait_answer(page, 0)
    assert page.get_attribute(".conv[aria-current]", "data-id") != original
    assert page.locator(".msg.user .content").all_inner_texts() == ["Name a tree."]
    assert page.locator(".msg.assistant").count() == 1
    page.click(f'.conv[data-id="{original}"] .conv-open')  # the original is unchanged
    assert page.locator(".msg.user .content").all_inner_texts() == ["Name a fruit.",
                                                                    "Name a vegetable."]


def test_rename_export_delete_and_import(page: Any, tmp_path: Path) -> None:
    page.click("#clear")
    ask(page, "Name an animal.")
    current = page.locator(".conv[aria-current]")
    conv_id = current.get_attribute("data-id")
    current.hover()
    current.locator(".conv-rename").click()
    page.fill(".conv-title", "Animals")
    page.press(".conv-title", "Enter")
    assert "Animals" in conversations(page)
    with page.expect_download() as download:
        page.click("#export")
    saved = tmp_path / "export.json"
    download.value.save_as(saved)
    exported = json.loads(saved.read_text())["conversations"]
    assert "Animals" in [c["title"] for c in exported]
    page.once("dialog", lambda dialog: dialog.accept())
    page.click(f'.conv[data-id="{conv_id}"] .conv-delete')
    page.wait_for_function("id => !document.querySelector(`.conv[data-id='${id}']`)",
                           arg=conv_id)
    assert "Animals" not in conversations(page)
    page.set_input_files("#import", str(saved))
    page.wait_for_function("id => document.querySelector(`.conv[data-id='${id}']`)", arg=conv_id)
    page.click(f'.conv[data-id="{conv_id}"] .conv-open')
    assert page.inner_text(".msg.user .content") == "Name an animal."


def test_the_api_key_stays_in_the_tab_and_errors_show_inline(page: Any, server: Server) -> None:
    browser = page.context.browser
    with LiveApp(create_app(server, alias=MODEL_ALIAS, api_key="secret")) as app, \
            browser_page.another_page(browser, app.url + "/") as page:
        page.wait_for_function("document.querySelector('#model').textContent.includes('key')")
        setting(page, "#max-tokens", "4")
        page.fill("#input", "Hello?")
        page.click("#send")
        error = page.locator(".msg.error")
        error.wait_for()
        assert "API key" in error.inner_text()  # the server's own message
        setting(page, "#api-key", "secret")
        page.wait_for_function("document.querySelector('#model').textContent.includes('smol')")
        error.locator(".act-retry").click()
        wait_answer(page, 0)
        assert page.evaluate("sessionStorage.getItem('llamapy.api-key')") == "secret"
        assert "secret" not in page.evaluate("JSON.stringify(localStorage)")


def test_tool_calls_show_as_blocks(page: Any) -> None:
    page.click("#clear")
    tool = {"type": "function", "function": {
        "name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    setting(page, "#extra", json.dumps({"tools": [tool], "tool_choice": "required"}))
    setting(page, "#max-tokens", "60")
    # greedy: at the page's default temperature (0.7) about one answer in ten writes a
    # placeholder that runs past the 60 tokens, and the arguments end unterminated
    setting(page, "#temperature", "0")
    bubble = ask(page, "What is the weather in Paris?")
    assert bubble.locator(".tool-call .tool-name").inner_text() == "→ get_weather"
    assert "city" in json.loads(bubble.locator(".tool-call .tool-args").inner_text())
    setting(page, "#extra", "{}")
    setting(page, "#max-tokens", "6")


def test_the_model_picker_sends_to_the_chosen_model(page: Any, model_path: Path) -> None:
    small = {"n_ctx": 512, "n_parallel": 1, "n_threads": 1, "n_batch": 256}
    manager = ModelManager([ModelSpec(name=name, path=model_path, options=small)
                            for name in ("one", "two")])
    with LiveApp(create_app(manager, own_server=True)) as app, \
            browser_page.another_page(page.context.browser, app.url + "/") as chat:
        chat.wait_for_function("document.querySelector('#model-picker').options.length === 2")
        assert chat.is_visible("#model-picker")
        chat.select_option("#model-picker", "two")
        setting(chat, "#max-tokens", "4")
        ask(chat, "Hi.")
        models = httpx.get(app.url + "/v1/models", timeout=30).json()["data"]
        assert {m["id"]: m["status"]["value"] for m in models} == {"one": "unloaded",
                                                                  "two": "loaded"}
        chat.reload()
        chat.wait_for_function("document.querySelector('#model').textContent === 'model: two'")
        assert chat.input_value("#model-picker") == "two"  # the conversation's own model
