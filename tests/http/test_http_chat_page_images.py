"""The chat page attaches images (a real headless Chromium, :mod:`browser_page`) on a model
served with the tiny vision projector: the attach button shows only when the model takes
images, the image is shown in the user's bubble, reaches the model (the prompt holds its 16
rows), the next turn, which sends it again, reuses its KV, and a reload keeps it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import browser_page
import pytest
from browser_page import ask, wait_answer
from live import LiveApp

from llamapy.media.samples import png
from llamapy.serve import create_app
from llamapy.server import Server
from llamapy.testing import tiny_mmproj_path

pytestmark = browser_page.pytestmark


@pytest.fixture(scope="module")
def vision_page(model_path: Path) -> Iterator[Any]:
    server = Server(model_path, mmproj=str(tiny_mmproj_path()), n_ctx=2048, n_parallel=1,
                    n_threads=1)
    server.wait_ready(60)
    with LiveApp(create_app(server, alias="vision", own_server=True)) as app, \
            browser_page.browser_page(app.url + "/") as page:
        yield page


def test_page_attaches_an_image_and_reuses_it(vision_page: Any, tmp_path: Path) -> None:
    page = vision_page
    page.wait_for_selector("#attach-label", state="visible")
    image = tmp_path / "red.png"
    image.write_bytes(png(24, 24, (220, 20, 20)))
    page.set_input_files("#attach", str(image))
    page.wait_for_selector("#attachments img")
    page.fill("#input", "What is in this image?")
    page.click("#send")
    first = wait_answer(page, 0)
    assert page.locator(".msg.user img").count() == 1
    assert page.is_hidden("#attachments")  # sent: nothing pending
    stats = first.locator(".msg-stats").inner_text()
    assert first.locator(".content").inner_text().strip(), stats
    second = ask(page, "And its colour?")
    assert "cached" in second.locator(".msg-stats").inner_text()
    assert page.locator(".msg.error").count() == 0
    page.reload()  # the conversation keeps its image
    page.wait_for_selector(".msg.user img")
    assert page.locator(".msg.user").count() == 2
