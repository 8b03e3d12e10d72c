"""llama.cpp's repository chat templates (``models/templates/*.jinja`` of the pinned source)
render on the real model as llama-server renders them (its ``test_template.py`` cases), and
llama.cpp's built-in template names resolve to templates."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from live import LiveApp

from llamapy._paths import cache_dir
from llamapy._pins import LLAMA_CPP_SOURCE
from llamapy.errors import UnsupportedFeatureError
from llamapy.serve import create_app
from llamapy.serve.flags.serving import REASONING_SWITCH, read_template
from llamapy.server import Server

TEMPLATES = cache_dir() / "src" / f"llama.cpp-{LLAMA_CPP_SOURCE.sha256[:16]}" / "models" / \
    "templates"
TOOL = {"type": "function", "function": {"name": "test", "description": "", "parameters": {
    "type": "object", "properties": {"success": {"type": "boolean", "const": True}},
    "required": ["success"]}}}
QUESTION = [{"role": "user", "content": "What is today?"}]


def template(name: str) -> str:
    path = TEMPLATES / f"{name}.jinja"
    assert path.is_file(), f"the pinned llama.cpp source has no {path} (run build_lib.py)"
    return path.read_text(encoding="utf-8")


@pytest.fixture()
def render(server: Server) -> Iterator:
    """``render(template_name, reasoning, **body) -> prompt`` through ``/apply-template``."""
    lives: list[LiveApp] = []

    def go(name: str, reasoning: str = "auto", **body: object) -> str:
        app = create_app(server, chat_template=template(name),
                         template_kwargs=dict(REASONING_SWITCH[reasoning]))
        live = LiveApp(app).start()
        lives.append(live)
        response = httpx.post(live.url + "/apply-template", json={"messages": QUESTION, **body},
                              timeout=60)
        assert response.status_code == 200, response.text
        return str(response.json()["prompt"])

    yield go
    for live in lives:
        live.stop()


@pytest.mark.parametrize("name,reasoning,end", [
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "on", "<think>\n"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "auto", "<think>\n"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "off", "<think>\n</think>"),
    ("Qwen-Qwen3-0.6B", "auto", "<|im_start|>assistant\n"),
    ("Qwen-Qwen3-0.6B", "off", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ("Qwen-QwQ-32B", "auto", "<|im_start|>assistant\n<think>\n"),
    ("Qwen-QwQ-32B", "off", "<|im_start|>assistant\n<think>\n</think>"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "auto",
     "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "off",
     "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>"),
])
def test_reasoning_switch_renders_as_llama_server(render: object, name: str, reasoning: str,
                                                  end: str) -> None:
    for tools in (None, [], [TOOL]):
        prompt = render(name, reasoning, tools=tools)  # type: ignore[operator]
        assert prompt.endswith(end), (tools, prompt[-80:])
        if tools and "tools" in template(name):
            assert '"test"' in prompt  # the tool is presented


@pytest.mark.parametrize("name,fmt", [("meta-llama-Llama-3.3-70B-Instruct", "%d %b %Y"),
                                      ("fireworks-ai-llama-3-firefunction-v2", "%b %d %Y")])
def test_date_inside_prompt(render: object, name: str, fmt: str) -> None:
    for tools in (None, [], [TOOL]):
        prompt = render(name, tools=tools)  # type: ignore[operator]
        assert datetime.date.today().strftime(fmt) in prompt


def test_add_generation_prompt_false(render: object) -> None:
    name = "meta-llama-Llama-3.3-70B-Instruct"
    turn = "<|start_header_id|>assistant<|end_header_id|>"
    assert turn in render(name, add_generation_prompt=True)  # type: ignore[operator]
    without = render(name, add_generation_prompt=False)  # type: ignore[operator]
    assert turn not in without and without.endswith("What is today?<|eot_id|>")


def test_builtin_names_resolve_to_templates(server: Server) -> None:
    app = create_app(server, chat_template=read_template("command-r"))
    messages = [{"role": "system", "content": "You are a test."},
                {"role": "user", "content": "Hi there"}]
    with LiveApp(app) as live:
        prompt = httpx.post(live.url + "/apply-template", json={"messages": messages},
                            timeout=60).json()["prompt"]
    assert prompt == ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
                      "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
                      "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
    for name in ("mistral-v7", "mistral-v7-tekken", "phi4", "deepseek3", "llama3", "chatml"):
        assert read_template(name) != name
    with pytest.raises(UnsupportedFeatureError, match="--chat-template-file"):
        read_template("granite-4.0")  # a llama.cpp name without a Jinja version here


def test_a_repository_template_generates(server: Server) -> None:
    app = create_app(server, chat_template=template("Qwen-QwQ-32B"))
    with LiveApp(app) as live:
        done = httpx.post(live.url + "/v1/chat/completions", timeout=120, json={
            "messages": QUESTION, "tools": [TOOL], "max_tokens": 4, "temperature": 0})
    assert done.status_code == 200, done.text
    assert done.json()["usage"]["completion_tokens"] >= 1


def test_pinned_templates_folder_exists() -> None:
    assert isinstance(TEMPLATES, Path) and len(list(TEMPLATES.glob("*.jinja"))) > 10
