"""Render a model's chat template the way Hugging Face ``apply_chat_template`` does.

A GGUF carries its template as ``tokenizer.chat_template``: Jinja source written for
``transformers``. We compile it in the same environment (an immutable sandbox with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension and a no-op
``{% generation %}`` tag), with the same helpers (``tojson``, ``raise_exception``,
``strftime_now``) and the same variables (``messages``, ``tools``, ``add_generation_prompt``,
``bos_token``, ``eos_token``, plus extra keyword arguments). Messages in OpenAI shape are
normalised first (see :mod:`llamapy.chat.messages_in`). Every failure, at compile or at render
time, becomes a :class:`~llamapy.errors.TemplateError` that carries the template's message.

Where llama.cpp's own Jinja runtime (what llama-server renders with) is more lenient, we follow
it, so its repository templates render alike: ``enable_thinking`` is ``true`` unless set,
``datetime`` ("Dec 01 2026") and ``date_string`` ("01 Dec 2026") hold today's date, and an
undefined variable or ``none`` concatenated with a string (``+``, ``~``) is the empty string.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llamapy.chat.messages_in import normalize_messages, normalize_tools
from llamapy.errors import TemplateError

#: The template used for models whose GGUF has none: plain ChatML.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


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


#: Marks where a continued message's text ends in its rendering (never in real text).
_CONTINUE_MARK = "\x00llamapy-continue\x00"


def _text_of(content: Any) -> str:
    """A message's content as text (text parts joined; None is "")."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content
                   if isinstance(p, Mapping) and p.get("type", "text") == "text")


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


def _date_context() -> dict[str, str]:
    """llama.cpp's extra template variables: today as ``datetime`` and ``date_string``."""
    now = datetime.now()
    return {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y")}


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


class ChatTemplate:
    """A compiled chat template.

    ``source`` is the Jinja text (``tokenizer.chat_template``); ``bos_token`` and ``eos_token``
    are the model's special-token texts, exposed to the template as variables. Compilation
    happens here, so a broken template fails at load time with :class:`TemplateError`.
    """

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(
                f"chat template does not compile: {exc.message} (line {exc.lineno})"
            ) from exc

    @classmethod
    def chatml(cls, *, bos_token: str = "", eos_token: str = "<|im_end|>") -> ChatTemplate:
        """The fallback ChatML template, for models whose GGUF carries no template."""
        return cls(CHATML_TEMPLATE, bos_token=bos_token, eos_token=eos_token)

    @classmethod
    def from_metadata(
        cls, source: str | None, *, bos_token: str = "", eos_token: str = ""
    ) -> ChatTemplate:
        """The model's own template, or ChatML when ``source`` is empty or missing."""
        if not source:
            return cls.chatml(bos_token=bos_token, eos_token=eos_token or "<|im_end|>")
        return cls(source, bos_token=bos_token, eos_token=eos_token)

    def render_continuation(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render a conversation whose last (assistant) message the model continues: the
        prompt ends inside that message, after its text, without the end-of-turn marks the
        template adds (llama-server's assistant prefill, vLLM's ``continue_final_message``).
        The message is rendered with a marker after its text and the prompt cut there, so any
        template works; one that drops the marker falls back to a new assistant turn followed
        by the text."""
        *head, last = messages
        text = _text_of(last.get("content"))
        marked = [*head, {**last, "content": text + _CONTINUE_MARK}]
        rendered = self.render(marked, tools=tools, add_generation_prompt=False, **kwargs)
        at = rendered.rfind(_CONTINUE_MARK)
        if at >= 0:
            return rendered[:at]
        return self.render(head, tools=tools, add_generation_prompt=True, **kwargs) + text

    @property
    def digest(self) -> str:
        """sha256 of the template source: the chat-template identity of a context manifest."""
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Render a conversation to prompt text.

        ``messages`` and ``tools`` are in OpenAI shape; extra keyword arguments become template
        variables (``enable_thinking=False``, ``documents=[...]``, ...). Raises
        :class:`TemplateError` for malformed messages and for any failure inside the template.
        """
        variables: dict[str, Any] = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "enable_thinking": True,
            **_date_context(),
            **kwargs,
            "messages": normalize_messages(messages),
            "tools": normalize_tools(tools),
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(**variables)
        except TemplateError:
            raise
        except Exception as exc:  # a template can fail in any Python operation it performs
            raise TemplateError(f"chat template failed to render: {exc}") from exc
