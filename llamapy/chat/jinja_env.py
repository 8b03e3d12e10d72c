"""The Jinja environment chat templates compile in (Hugging Face's, with llama.cpp's leniency).

An immutable sandbox with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension,
a no-op ``{% generation %}`` tag, HF's helpers (``tojson``, ``raise_exception``,
``strftime_now``), an undefined that joins strings as the empty string, and ``none + "text"``
as ``"text"``. Imported by :class:`~llamapy.chat.ChatTemplate` when it compiles its first
template, so a process that never renders a chat prompt never imports jinja2.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llamapy.errors import TemplateError

__all__ = ["compile_template"]


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: HF marks assistant spans; we just render."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Callable[[], str]) -> str:
        return caller()


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """HF's ``tojson``: plain ``json.dumps`` (Jinja's own one HTML-escapes and sorts keys)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(f"chat template error: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Undefined(jinja2.Undefined):
    """llama.cpp's undefined: the empty string when concatenated with a string."""

    def __add__(self, other: object) -> Any:
        return other if isinstance(other, str) else super().__add__(other)

    def __radd__(self, other: object) -> Any:
        return other if isinstance(other, str) else super().__radd__(other)


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox, with llama.cpp's ``none + "text"`` (the empty string joined)."""

    intercepted_binops = frozenset({"+"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "+" and ((left is None and isinstance(right, str))
                                or (right is None and isinstance(left, str))):
            return left or right or ""
        return super().call_binop(context, operator, left, right)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _Environment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
        undefined=_Undefined,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def compile_template(source: str) -> jinja2.Template:
    """Compile ``source``; a syntax error becomes :class:`TemplateError` with its line."""
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"chat template does not compile: {exc.message} (line {exc.lineno})"
        ) from exc
