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
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from llamapy.chat.messages_in import normalize_messages, normalize_tools
from llamapy.errors import TemplateError

#: The template used for models whose GGUF has none: plain ChatML.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


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


def _date_context() -> dict[str, str]:
    """llama.cpp's extra template variables: today as ``datetime`` and ``date_string``."""
    now = datetime.now()
    return {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y")}


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
        from llamapy.chat.jinja_env import compile_template  # jinja2 loads with the first template

        self._template = compile_template(source)

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
