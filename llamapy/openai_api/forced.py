"""A forced tool call that starts at once, in the family's own syntax.

llama.cpp's grammar for ``tool_choice: "required"`` lets free text (and a whole reasoning
block) come before the call: its root reads ``<generation prompt> until-N? tool-call``, where
``until-N`` is any text up to the call's opening (gpt-oss: ``(start any)* start tool-call``,
whole messages first). A small model then writes prose until its budget runs out and never
calls. :func:`call_at_once` rewrites that root so the call comes first: the free text before
the call is dropped, and a reasoning block the generation prompt opened must close at once
(its start tag, then its end tag, before the call). The call's own rules (its syntax, the
tools' names and argument schemas) are llama.cpp's, unchanged. A root of another shape is
left as it is.
"""

from __future__ import annotations

import json
import re

from ..grammar.gbnf import literal
from ..server.chat_format import ChatParams

__all__ = ["call_at_once"]

#: Free text before the call: ``until-N`` (optional or not), and gpt-oss's whole messages.
_FREE = re.compile(r"until-\d+\??|\(start (?:any|analysis)\)\*")
#: A "tool-calls" rule that only repeats "tool-call" (no section around the calls).
_ONE_OR_MORE = re.compile(r"\(tool-call(?: space)?\)\+")
#: The element that is the call (or calls): the first rule named for it.
_CALL = re.compile(r"(?:[\w-]*tool-calls?(?:-root)?|tools)\Z")


def call_at_once(params: ChatParams, *, parallel: bool = False) -> str:
    """The grammar of ``params`` (a forced call's) with its root rewritten (see the
    module; without ``parallel``, one call); the grammar unchanged when its root has no such
    shape."""
    lines = params.grammar.splitlines()
    rules = dict(line.split(" ::= ", 1) for line in lines if " ::= " in line)
    for i, line in enumerate(lines):
        if line.startswith("root ::= "):
            root = _rewrite(rules["root"], rules, params, parallel)
            if root is not None:
                lines[i] = "root ::= " + root
            break
    return "\n".join(lines) + "\n"


def _rewrite(body: str, rules: dict[str, str], params: ChatParams, parallel: bool
             ) -> str | None:
    elements = _top_level(body)
    call = next((i for i, e in enumerate(elements) if _CALL.match(e)), None)
    if call is None or not any(_free(e) for e in elements[:call]):
        return None
    if not _prefill_fits(elements, rules, params):
        return None
    kept = [e for e in elements[:call] if not _free(e)]
    calls = elements[call:]
    if not parallel and calls[0] == "tool-calls" and _ONE_OR_MORE.fullmatch(
            rules.get("tool-calls", "")):
        calls[0] = "tool-call"  # (one call: llama.cpp's "tool-calls" only repeats it)
    return " ".join([*kept, *_closing(params), *calls])


def _free(element: str) -> bool:
    """Free text before the call: ``until-N``, gpt-oss's whole messages, or an optional
    group that holds free text (a reasoning block, a preamble)."""
    return bool(_FREE.fullmatch(element)) or (
        element.startswith("(") and element.endswith(")?") and "until-" in element)


def _prefill_fits(elements: list[str], rules: dict[str, str], params: ChatParams) -> bool:
    """Whether the generation prompt (which the grammar reads first) is the root's leading
    literals (or rules that are one literal), then at most the reasoning block's opening:
    the rewritten root reads nothing else before the call."""
    leading = ""
    for element in (e for e in elements if not _free(e)):
        text = rules.get(element, element)
        if not (text.startswith('"') and text.endswith('"')):
            break
        try:
            leading += json.loads(text)
        except ValueError:  # (a GBNF escape JSON does not share)
            return False
    prompt = params.generation_prompt
    if not prompt.startswith(leading):
        return False
    rest = prompt[len(leading):].strip()
    return not rest or rest == params.thinking_start_tag.strip()


def _closing(params: ChatParams) -> list[str]:
    """A reasoning block the generation prompt opened, closed at once (empty)."""
    start = params.thinking_start_tag.strip()
    if not start or not params.thinking_end_tags or \
            not params.generation_prompt.rstrip().endswith(start):
        return []
    return [literal(start), r"[ \t\n]*", literal(params.thinking_end_tags[0].strip()),
            r"[ \t\n]*"]


def _top_level(body: str) -> list[str]:
    """``body`` split at the spaces outside parentheses, brackets and string literals."""
    out: list[str] = []
    current: list[str] = []
    depth, quoted, escaped = 0, False, False
    for char in body:
        if quoted:
            quoted = not (char == '"' and not escaped)
            escaped = char == "\\" and not escaped
        elif char == '"':
            quoted = True
        elif char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif char == " " and depth == 0:
            if current:
                out.append("".join(current))
            current = []
            continue
        current.append(char)
    if current:
        out.append("".join(current))
    return out
