"""HTTP tests: the real app on the real model, served by uvicorn on a free loopback port.

One session-wide 4-slot server and app (small ``n_ctx`` so tests stay fast on 2 cores); tests
that need other settings start their own with :class:`LiveApp`. Tests must leave the shared
server idle.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from http_helpers import MODEL_ALIAS, THINKING_TEMPLATE
from live import LiveApp

from llamapy.models import default_model_path
from llamapy.serve import create_app
from llamapy.server import Server


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The default model (``python -m llamapy.models fetch``, run by .ci/run, provides it)."""
    return default_model_path()


@pytest.fixture(scope="session")
def server(model_path: Path) -> Iterator[Server]:
    """The shared server (one llama.cpp thread: the client and uvicorn need the other core,
    and a thread that waits for a busy core stalls every decode)."""
    with Server(model_path, n_ctx=4096, n_parallel=4, n_batch=512, chunk_size=256,
                max_queue=32, n_threads=1) as s:
        s.wait_ready(60)
        yield s


@pytest.fixture(scope="session")
def live(server: Server) -> Iterator[LiveApp]:
    """The app on the shared server, served on a free 127.0.0.1 port."""
    with LiveApp(create_app(server, alias=MODEL_ALIAS)) as app:
        yield app


@pytest.fixture(scope="session")
def thinking(server: Server) -> Iterator[LiveApp]:
    """An app on the shared server whose chat template shows reasoning
    (:data:`http_helpers.THINKING_TEMPLATE`)."""
    with LiveApp(create_app(server, alias=MODEL_ALIAS, chat_template=THINKING_TEMPLATE)) as app:
        yield app


@pytest.fixture(scope="session")
def thinking_client(thinking: LiveApp) -> openai.OpenAI:
    """The official OpenAI client on :func:`thinking`."""
    return openai.OpenAI(base_url=thinking.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


@pytest.fixture(scope="session")
def http(live: LiveApp) -> Iterator[httpx.Client]:
    """An httpx client on the live app."""
    with httpx.Client(base_url=live.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def client(live: LiveApp) -> openai.OpenAI:
    """The official OpenAI client on the live app."""
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)

