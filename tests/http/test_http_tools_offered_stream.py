"""Tools offered but not called, streamed (llama.cpp's test_completion_without_tool_call_fast,
on Llama 3.3's template of the pinned source): the content streams as it is generated, in
non-empty deltas after the role chunk, and adds up to the non-streamed answer."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from live import LiveApp

from llamapy._paths import cache_dir
from llamapy._pins import LLAMA_CPP_SOURCE
from llamapy.serve import create_app
from llamapy.server import Server

TEMPLATE = (cache_dir() / "src" / f"llama.cpp-{LLAMA_CPP_SOURCE.sha256[:16]}" / "models" /
            "templates" / "meta-llama-Llama-3.3-70B-Instruct.jinja")
TOOL = {"type": "function", "function": {"name": "test", "description": "", "parameters": {
    "type": "object", "properties": {"success": {"type": "boolean", "const": True}},
    "required": ["success"]}}}
BODY = {"max_tokens": 48, "temperature": 0, "tools": [TOOL], "messages": [
    {"role": "system", "content": "You are a coding assistant."},
    {"role": "user", "content": "say hello world with python"}]}


@pytest.fixture(scope="module")
def llama33(server: Server) -> Iterator[str]:
    assert TEMPLATE.is_file(), f"the pinned llama.cpp source has no {TEMPLATE}"
    with LiveApp(create_app(server, chat_template=TEMPLATE.read_text(encoding="utf-8"))) as app:
        yield app.url


def test_content_streams_in_non_empty_deltas(llama33: str) -> None:
    whole = httpx.post(llama33 + "/v1/chat/completions", json=BODY, timeout=120).json()
    assert "choices" in whole, whole
    message = whole["choices"][0]["message"]
    assert message.get("tool_calls") is None and message["content"], whole
    r = httpx.post(llama33 + "/v1/chat/completions", json={**BODY, "stream": True}, timeout=120)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": None}
    parts = [d["content"] for d in deltas[1:] if d.get("content") is not None]
    assert all(parts) and len(parts) > 1
    assert "".join(parts) == message["content"]
    assert not any("tool_calls" in d for d in deltas)
