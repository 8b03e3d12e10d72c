"""``python -m llamapy "prompt"`` prompts the model exactly as the HTTP server's chat route does:
one chat renderer (the GGUF's Jinja template, BOS added once) for both, so one model never
gets two prompts for one message (llama.cpp's built-in renderer knows no template's default
system prompt, e.g. SmolLM2's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamapy.__main__ import _prompt_tokens, main
from llamapy.openai_api import chat_completion
from llamapy.server import Server

QUESTION = "Name three colors."


def test_the_command_line_answers_as_the_chat_route_does(
        model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([QUESTION, "--model", str(model_path), "--max-tokens", "16", "--temp", "0"]) == 0
    printed = capsys.readouterr().out
    with Server(model_path, n_ctx=4096, n_parallel=1) as server:
        reply = chat_completion(server, {"messages": [{"role": "user", "content": QUESTION}],
                                         "max_tokens": 16, "temperature": 0})
        raw = _prompt_tokens(server.wait_ready(), QUESTION, raw=True)
        templated = _prompt_tokens(server, QUESTION, raw=False)
    assert printed == reply["choices"][0]["message"]["content"] + "\n"
    assert reply["usage"]["prompt_tokens"] == len(templated) > len(raw)
