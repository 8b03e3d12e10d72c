"""Take the README's screenshots of the chat page and the live view (docs/img/*.png).

    python3 docs/screenshots.py        (from a worktree not pip-installed: PYTHONPATH=. first)

Serves the default model on a free port, chats through the page in headless Chromium (Playwright
with the system's ``chromium``), runs a little traffic with repeated prompts so the live view's
slots and cache chart have something to show, and saves both pages. Takes about a minute.
"""

from __future__ import annotations

import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from playwright.sync_api import sync_playwright

from llamapy.models import default_model_path
from llamapy.serve import create_app
from llamapy.server import Server

OUT = Path(__file__).with_name("img")
PROMPTS = ["Write a Python function that reverses a string.",
           "What is the capital of France? Answer in one sentence.",
           "List three colours.",
           "Explain what a prompt cache is in two sentences.",
           "Name two planets.",
           "Give me a haiku about autumn."]
SYSTEM = "You are a helpful assistant. Answer briefly."


def serve(server: Server) -> tuple[str, uvicorn.Server]:
    """The app on a free loopback port, served on a thread."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    web = uvicorn.Server(uvicorn.Config(create_app(server, alias="smol"), log_level="warning"))
    threading.Thread(target=web.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not web.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", web


def traffic(url: str, rounds: int) -> None:
    """Concurrent chats, each prompt several times (own-slot and donor reuse)."""
    def one(i: int) -> None:
        body = {"messages": [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                "max_tokens": 48 + 16 * (i % 3)}
        httpx.post(url + "/v1/chat/completions", json=body, timeout=120)

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(one, range(rounds)))


def chat_page(browser: Any, url: str) -> None:
    page = browser.new_page(viewport={"width": 1200, "height": 760})
    page.goto(url + "/")
    page.click("#toggle-settings")
    page.fill("#system", SYSTEM)
    page.dispatch_event("#system", "change")
    page.fill("#temperature", "0")
    page.dispatch_event("#temperature", "change")
    page.click("#toggle-settings")
    for n, prompt in enumerate(PROMPTS[:2]):
        page.fill("#input", prompt)
        page.click("#send")
        page.wait_for_function(
            "n => document.querySelectorAll('.msg.assistant')[n]?.dataset.done === 'true'",
            arg=n, timeout=120_000)
    page.evaluate("document.activeElement.blur()")
    page.screenshot(path=str(OUT / "chat.png"))


def dashboard_page(browser: Any, url: str) -> None:
    page = browser.new_page(viewport={"width": 1200, "height": 1000})
    page.goto(url + "/dashboard?minutes=1")
    traffic(url, 30)
    busy = threading.Thread(target=traffic, args=(url, 3))
    busy.start()
    page.wait_for_selector('.slot[data-state="decoding"]', timeout=60_000)
    page.screenshot(path=str(OUT / "dashboard.png"), full_page=True)
    busy.join()


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with Server(default_model_path(), n_ctx=4096, n_parallel=4, n_threads=1,
                prompt_cache_ram_mb=64) as server:
        server.wait_ready(60)
        url, web = serve(server)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=shutil.which("chromium"),
                                         args=["--no-sandbox", "--headless", "--disable-gpu"])
            chat_page(browser, url)
            dashboard_page(browser, url)
            browser.close()
        web.should_exit = True
    for name in ("chat.png", "dashboard.png"):
        print(name, (OUT / name).stat().st_size // 1024, "KiB")


if __name__ == "__main__":
    main()
