"""Record what llama-server makes of llama.cpp's own chat templates (a script, not a test).

For every ``models/templates/*.jinja`` of the pinned llama.cpp source this starts the
llama-server built with the library once (``-m <default model> --jinja --chat-template-file
<template> -c 4096 -np 1``) and records, for two conversations (``plain``: system and user;
``tools``: two tools, an assistant tool call, the tool's answer and a last user message):

- ``/apply-template``'s prompt, or the error status and message where the template refuses;
- ``/tokenize`` of that prompt with ``add_special`` and ``parse_special`` true, the flags
  llama-server's chat path tokenizes a rendered prompt with (``tokenize_input_prompts(...,
  true, true)`` in ``tools/server/server-context.cpp``);
- the local date it rendered on (templates that call ``strftime_now`` render it);

and ``/v1/chat/completions`` on the ``tools`` conversation with ``tool_choice: "required"``,
greedy, 96 tokens at most (``forced``: the returned message, or the error). A template that
llama-server refuses at start is recorded as ``{"startup_error": <log tail>}``.

The result is ``tests/chat_layer/data/llama_server_templates.json`` (sorted keys; the header
entry ``__header__`` names the llama.cpp pin, the model file and the conversations), which
``test_prompt_parity.py`` compares llamapy's chat layer with. Run it again after a llama.cpp
pin bump, from the repository root, once ``build_lib.py`` has built the library and
``python -m llamapy.models fetch`` fetched the default model::

    python3 tests/chat_layer/make_llama_server_fixtures.py

It takes a few minutes (one server start per template, on 127.0.0.1 only).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llamapy._paths import cache_dir  # noqa: E402
from llamapy._pins import LLAMA_CPP_SOURCE  # noqa: E402
from llamapy.models import default_model_path  # noqa: E402

PIN = f"llama.cpp-{LLAMA_CPP_SOURCE.sha256[:16]}"
TEMPLATES = cache_dir() / "src" / PIN / "models" / "templates"
OUT = Path(__file__).resolve().parent / "data" / "llama_server_templates.json"
HEADER = "__header__"
START_TIMEOUT_S = 60.0

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather forecast for a place.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "The city."},
            "days": {"type": "integer", "description": "How many days ahead."}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The current time in a time zone.",
        "parameters": {"type": "object", "properties": {
            "timezone": {"type": "string", "description": "An IANA time zone name."}},
            "required": ["timezone"]}}},
]
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CONVERSATIONS: dict[str, dict[str, Any]] = {
    "plain": {"messages": [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]},
    "tools": {"tools": TOOLS, "messages": [
        SYSTEM,
        {"role": "user", "content": "What is the weather in Paris for the next 3 days?"},
        # nine alphanumerics: Mistral's templates refuse any other tool call id
        {"role": "assistant", "tool_calls": [{"id": "call00001", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"location": "Paris", "days": 3})}}]},
        {"role": "tool", "tool_call_id": "call00001",
         "content": json.dumps({"forecast": ["sunny", "cloudy", "rain"]})},
        {"role": "user", "content": "And what time is it there now?"},
    ]},
}
#: the bodies as sent (JSON text: the order of their keys is part of what a template renders)
BODIES = {name: json.dumps(body) for name, body in CONVERSATIONS.items()}
FORCED = {"tool_choice": "required", "temperature": 0, "max_tokens": 96, "seed": 1}
JSON = {"Content-Type": "application/json"}


def server_binary() -> Path:
    """The llama-server built beside libllama."""
    out = subprocess.run([sys.executable, str(ROOT / "build_lib.py"), "--print-path"],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1]) / "llama-server"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(proc: subprocess.Popen[bytes], url: str) -> bool:
    """Whether the server answered /health with 200 before it exited or the time ran out."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    return False


def error_of(response: httpx.Response) -> dict[str, Any]:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text
    return {"error": response.status_code, "message": message}


def render(client: httpx.Client, body: str) -> dict[str, Any]:
    """/apply-template's prompt for ``body`` (JSON text) and its tokens, or the error."""
    date = time.strftime("%Y-%m-%d")
    response = client.post("/apply-template", content=body, headers=JSON)
    if response.status_code != 200:
        return error_of(response)
    prompt = response.json()["prompt"]
    tokens = client.post("/tokenize", json={"content": prompt, "add_special": True,
                                            "parse_special": True})
    tokens.raise_for_status()
    return {"prompt": prompt, "tokens": tokens.json()["tokens"], "date": date}


def forced_call(client: httpx.Client) -> dict[str, Any]:
    """The answer to the tools conversation under ``tool_choice: "required"``."""
    body = json.dumps({**CONVERSATIONS["tools"], **FORCED})
    response = client.post("/v1/chat/completions", content=body, headers=JSON)
    if response.status_code != 200:
        return error_of(response)
    choice = response.json()["choices"][0]
    return {"message": choice["message"], "finish_reason": choice["finish_reason"]}


def record(binary: Path, model: Path, template: Path) -> dict[str, Any]:
    """Everything llama-server says about ``template``; the server is stopped on return."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(binary), "-m", str(model), "--jinja", "--chat-template-file", str(template),
           "-c", "4096", "--host", "127.0.0.1", "--port", str(port), "-np", "1"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            if not wait_healthy(proc, url):
                log.seek(0)
                return {"startup_error": log.read().decode("utf-8", "replace")[-2000:]}
            with httpx.Client(base_url=url, timeout=120) as client:
                entry = {name: render(client, body) for name, body in BODIES.items()}
                entry["forced"] = forced_call(client)
                return entry
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def is_tool_call(entry: dict[str, Any]) -> bool:
    """Whether llama-server answered the forced conversation with a tool call."""
    forced = entry.get("forced", {})
    return "error" not in forced and bool(forced.get("message", {}).get("tool_calls"))


def dump(data: dict[str, Any]) -> str:
    """JSON with sorted keys, one template a line (so a pin bump's diff names the templates)."""
    lines = [f" {json.dumps(key)}: {json.dumps(data[key], sort_keys=True, ensure_ascii=False)}"
             for key in sorted(data)]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main() -> int:
    binary, model = server_binary(), default_model_path()
    data: dict[str, Any] = {HEADER: {"llama_cpp": PIN, "model": model.name,
                                     "conversations": BODIES, "forced": FORCED}}
    templates = sorted(TEMPLATES.glob("*.jinja"))
    for i, template in enumerate(templates, 1):
        started = time.monotonic()
        data[template.name] = entry = record(binary, model, template)
        states = {k: "error" if "error" in v else "ok" for k, v in entry.items()
                  if isinstance(v, dict)}
        print(f"[{i}/{len(templates)}] {template.name}: {states or entry.keys()} "
              f"call={is_tool_call(entry)} {time.monotonic() - started:.1f}s", flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(dump(data), encoding="utf-8")
    calls = sum(is_tool_call(data[t.name]) for t in templates)
    print(f"{len(templates)} templates; a tool call under tool_choice required: {calls}; "
          f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
