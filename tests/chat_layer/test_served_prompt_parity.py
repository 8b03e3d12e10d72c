"""llamapy's own ``/apply-template`` (the served chat path: the OpenAI body parsed, the
server's defaults applied) renders llama.cpp's templates as llama-server's does.

The same recording as :mod:`test_prompt_parity` (``data/llama_server_templates.json``), one
server on the default model, a :class:`~llamapy.openai_api.ServedModel` per template. Where
llamapy differs on purpose it is asserted too: a template that can neither list tools nor show
calls (SmolLM2's kind) gets the tools in its system message (``tool_instructions``), so its
``tools`` prompt is llamapy's own.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from test_prompt_parity import CONVERSATIONS, RECORDED, TEMPLATES, as_recorded

from llamapy.errors import LlamapyError
from llamapy.models import default_model_path
from llamapy.openai_api import ServedModel
from llamapy.openai_api.llama_compat import apply_template
from llamapy.server import Server


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Server(default_model_path(), n_ctx=1024, n_parallel=1, n_threads=1) as s:
        s.wait_ready(60)
        yield s


def stand_in(served: ServedModel) -> bool:
    caps = served.chat_templates().caps
    return not (caps["supports_tools"] or caps["supports_tool_calls"])


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("name", sorted(n for n in RECORDED if "startup_error" not in RECORDED[n]))
def test_the_served_prompt_is_llama_servers(server: Server, name: str,
                                            conversation: str) -> None:
    served = ServedModel(server, chat_template=(TEMPLATES / name).read_text("utf-8"))
    expected = RECORDED[name][conversation]
    body: dict[str, Any] = dict(CONVERSATIONS[conversation])
    if "error" in expected:
        with pytest.raises(LlamapyError) as refused:
            apply_template(served, body)
        assert refused.value.http_status == 400
        return
    before = datetime.date.today()
    prompt = apply_template(served, body)["prompt"]
    prompt = as_recorded(prompt, (before, datetime.date.today()),
                         datetime.date.fromisoformat(expected["date"]))
    if conversation == "tools" and stand_in(served):
        assert prompt != expected["prompt"] and "<tool_call>" in prompt
        return
    assert prompt == expected["prompt"]
