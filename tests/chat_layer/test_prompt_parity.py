"""llamapy's chat layer renders llama.cpp's own templates as llama-server does.

For every ``models/templates/*.jinja`` of the pinned llama.cpp source, the prompt
:meth:`ChatTemplates.apply` makes of two conversations (``plain``: system and user; ``tools``:
two tools, an assistant tool call, the tool's answer, a last user message) is the prompt
llama-server's ``/apply-template`` returned, character for character, and the model
tokenizes it as llama-server's chat path does (``add_special`` and ``parse_special`` true) into
the same tokens; a conversation llama-server refused raises :class:`TemplateError`. What
llama-server said is recorded in ``data/llama_server_templates.json`` by
``make_llama_server_fixtures.py`` (run it again after a llama.cpp pin bump).

The inputs are those ``oaicompat_chat_params_parse`` (``tools/server/server-common.cpp``) hands
``common_chat_templates_apply`` for such a body on a server started with ``--jinja`` and no
reasoning flag: ``tool_choice`` auto, ``parallel_tool_calls`` from the template's caps, a
generation prompt, the ``deepseek`` reasoning format (``common_params``' default),
``enable_thinking`` when the template reads it (``--reasoning auto``) and the
``preserve_reasoning`` template argument that llama.cpp's argument parser sets by default.

Templates that call ``strftime_now`` render the day: a prompt rendered on another day than the
recording has that day written as the recorded one before the comparison (both sides use the
local time), so the clock is the only input that differs.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from llamapy._native.chat_layer import ChatTemplates
from llamapy._paths import cache_dir
from llamapy._pins import LLAMA_CPP_SOURCE
from llamapy.errors import TemplateError
from llamapy.models import default_model_path

PIN = f"llama.cpp-{LLAMA_CPP_SOURCE.sha256[:16]}"
TEMPLATES = cache_dir() / "src" / PIN / "models" / "templates"
RECORDED: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "llama_server_templates.json").read_text("utf-8"))
HEADER: dict[str, Any] = RECORDED.pop("__header__")
#: the bodies as llama-server got them (JSON text: the order of keys is rendered too)
CONVERSATIONS: dict[str, dict[str, Any]] = {
    name: json.loads(body) for name, body in HEADER["conversations"].items()}
#: the formats llama.cpp's templates pass ``strftime_now``, and the ``datetime`` its chat layer
#: gives firefunction's template (``common/chat.cpp``: ``%b %d %Y``)
DATE_FORMATS = ("%Y-%m-%d", "%d %b %Y", "%B %d, %Y", "%b %d %Y")


def server_inputs(templates: ChatTemplates, body: dict[str, Any]) -> dict[str, Any]:
    """What llama-server's ``/apply-template`` renders ``body`` with (see the module doc)."""
    return {**body, "tool_choice": "auto", "use_jinja": True, "add_generation_prompt": True,
            "parallel_tool_calls": templates.caps["supports_parallel_tool_calls"],
            "reasoning_format": "deepseek",
            "enable_thinking": templates.supports_enable_thinking,
            "chat_template_kwargs": {"preserve_reasoning": True}}


def as_recorded(prompt: str, days: Iterable[datetime.date], recorded: datetime.date) -> str:
    """``prompt``, rendered on one of ``days``, with that day written as ``recorded``."""
    for day in set(days) - {recorded}:
        for fmt in DATE_FORMATS:
            prompt = prompt.replace(day.strftime(fmt), recorded.strftime(fmt))
    return prompt


@pytest.fixture(scope="module")
def model() -> Iterator[Any]:
    from llamapy._native.model import Model

    with Model(default_model_path()) as m:
        yield m


@pytest.fixture(scope="module")
def templates(model: Any) -> Iterator[dict[str, ChatTemplates]]:
    """One :class:`ChatTemplates` per template file, made on first use."""
    made: dict[str, ChatTemplates] = {}
    yield made
    for one in made.values():
        one.close()


def load(made: dict[str, ChatTemplates], model: Any, name: str) -> ChatTemplates:
    if name not in made:
        path = TEMPLATES / name
        assert path.is_file(), f"the pinned llama.cpp source has no {path} (run build_lib.py)"
        made[name] = ChatTemplates(model, path.read_text(encoding="utf-8"))
    return made[name]


def test_the_recording_is_of_this_pin_and_model() -> None:
    assert HEADER["llama_cpp"] == PIN, "run tests/chat_layer/make_llama_server_fixtures.py"
    assert HEADER["model"] == default_model_path().name
    assert sorted(RECORDED) == sorted(p.name for p in TEMPLATES.glob("*.jinja"))


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("name", sorted(RECORDED))
def test_prompt_and_tokens_are_llama_servers(model: Any, templates: dict[str, ChatTemplates],
                                             name: str, conversation: str) -> None:
    recorded = RECORDED[name]
    if "startup_error" in recorded:
        with pytest.raises(TemplateError):
            load(templates, model, name)
        return
    chat = load(templates, model, name)
    expected = recorded[conversation]
    inputs = server_inputs(chat, CONVERSATIONS[conversation])
    if "error" in expected:
        with pytest.raises(TemplateError):
            chat.apply(inputs)
        return
    before = datetime.date.today()
    prompt = chat.apply(inputs).prompt
    days = (before, datetime.date.today())
    prompt = as_recorded(prompt, days, datetime.date.fromisoformat(expected["date"]))
    assert prompt == expected["prompt"]
    assert model.tokenize(prompt, add_special=True, parse_special=True) == expected["tokens"]
