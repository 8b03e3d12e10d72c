"""The agents' workload of ``bench_agents.py``: the system prompt, the tools, each agent's
deterministic task and tool steps, and each turn's request body for Anthropic Messages and
the OpenAI Responses API (the same conversation in both shapes)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from http_load import text_of

from llamapy.models import default_model_path

MAX_TOKENS = 48
MODEL = default_model_path().stem  # llama-server answers any name, llamapy.serve its own


def system_prompt(words: int = 610) -> str:
    """The agents' system prompt with ``words`` words of project notes (610: ~680 tokens)."""
    return ("You are a coding agent working in a software repository. Use the tools to read "
            "files, run commands and search code; answer briefly. Project notes follow. "
            + text_of(random.Random(31), words))


#: The system prompt every agent sends (``bench_agents.py --system-words`` sets it).
SYSTEM = system_prompt()
TOOLS: list[dict[str, Any]] = [
    {"name": "read_file", "description": "Read a text file of the repository.",
     "input_schema": {"type": "object", "required": ["path"], "properties": {
         "path": {"type": "string", "description": "Path relative to the repository root"},
         "max_lines": {"type": "integer", "minimum": 1, "maximum": 2000}}}},
    {"name": "run_command", "description": "Run a shell command and return its output.",
     "input_schema": {"type": "object", "required": ["command"], "properties": {
         "command": {"type": "string"},
         "timeout_s": {"type": "number", "minimum": 1, "maximum": 600}}}},
    {"name": "search_code", "description": "Search the repository for a pattern.",
     "input_schema": {"type": "object", "required": ["query"], "properties": {
         "query": {"type": "string"},
         "max_results": {"type": "integer", "minimum": 1, "maximum": 50}}}},
]
RESPONSES_TOOLS = [{"type": "function", "name": t["name"], "description": t["description"],
                    "parameters": t["input_schema"]} for t in TOOLS]



@dataclass(frozen=True, slots=True)
class Step:
    """One past turn of an agent: its answer (fixed text), its tool call, the tool's result."""

    answer: str
    call_id: str
    name: str
    args: dict[str, Any]
    result: str


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of an agent: its history so far, and whether tools are offered."""

    agent_id: str
    task: str
    steps: list[Step]
    tools: bool
    #: The model's own answers to the earlier turns (``--own-answers``), else empty.
    answers: tuple[str, ...] = ()

    def answer(self, k: int) -> str:
        """The history's answer of past turn ``k``: the model's own, else the fixed text."""
        return self.answers[k] if k < len(self.answers) else self.steps[k].answer

    def call_text(self, k: int) -> str:
        """Past turn ``k``'s answer and tool call written as text (when no tools are offered)."""
        s = self.steps[k]
        return f"{self.answer(k)}\n<tool_call>" \
               f"{json.dumps({'name': s.name, 'arguments': s.args})}</tool_call>"


def steps_of(agent: int, turns: int) -> tuple[str, list[Step]]:
    """An agent's task and its tool steps, deterministic, the same for every server."""
    rng = random.Random(1000 + agent)
    task = f"Agent {agent}: the checks fail. Find out why and fix it. " + text_of(rng, 30)
    steps = []
    for t in range(turns):
        name = TOOLS[t % len(TOOLS)]["name"]
        args = {"read_file": {"path": f"src/pkg{agent}/module{t}.py"},
                "run_command": {"command": f"pytest -q tests/test_{agent}_{t}.py"},
                "search_code": {"query": f"def handler_{agent}_{t}"}}[name]
        result = f"[{name} output, agent {agent}, step {t + 1}] " + text_of(
            rng, rng.randint(100, 180))
        steps.append(Step(f"Step {t + 1}: " + text_of(rng, 24), f"call_{agent}_{t}", name,
                          args, result))
    return task, steps


def messages_input(turn: Turn) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": turn.task}]
    for k, s in enumerate(turn.steps):
        if not turn.tools:
            msgs += [{"role": "assistant", "content": turn.call_text(k)},
                     {"role": "user", "content": s.result}]
            continue
        msgs.append({"role": "assistant", "content": [
            {"type": "text", "text": turn.answer(k)},
            {"type": "tool_use", "id": s.call_id, "name": s.name, "input": s.args}]})
        msgs.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": s.call_id, "content": s.result}]})
    return msgs


def responses_input(turn: Turn) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": turn.task}]
    for k, s in enumerate(turn.steps):
        if not turn.tools:
            items += [{"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": turn.call_text(k)}]},
                {"role": "user", "content": s.result}]
            continue
        items.append({"type": "message", "role": "assistant",
                      "content": [{"type": "output_text", "text": turn.answer(k)}]})
        items.append({"type": "function_call", "call_id": s.call_id, "name": s.name,
                      "arguments": json.dumps(s.args)})
        items.append({"type": "function_call_output", "call_id": s.call_id,
                      "output": s.result})
    return items
