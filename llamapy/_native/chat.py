"""llama.cpp's built-in (non-Jinja) chat template formatter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import TemplateError
from ._loader import c_bytes, native
from .model import Model


def apply_chat_template(model: Model, messages: Sequence[Mapping[str, str]],
                        add_generation_prompt: bool = True, template: str | None = None) -> str:
    """Format ``messages`` (``role``/``content``) with the model's built-in template.

    This uses ``llama_chat_apply_template``, which recognises a fixed list of well-known
    templates; full Jinja rendering lives in :mod:`llamapy.chat`.
    """
    ffi, lib = native().ffi, native().lib
    tmpl = template if template is not None else model.chat_template()
    keep = []
    msgs = ffi.new("llama_chat_message[]", max(1, len(messages)))
    for i, m in enumerate(messages):
        role = ffi.new("char[]", str(m["role"]).encode())
        content = ffi.new("char[]", str(m.get("content") or "").encode())
        keep += [role, content]
        msgs[i].role, msgs[i].content = role, content
    tmpl_c = ffi.new("char[]", tmpl.encode()) if tmpl else ffi.NULL
    size = 256 + 2 * sum(len(str(m.get("content") or "")) for m in messages)
    for _ in range(2):
        buf = ffi.new("char[]", size)
        n = lib.llama_chat_apply_template(tmpl_c, msgs, len(messages), add_generation_prompt,
                                          buf, size)
        if n < 0:
            raise TemplateError("the model's chat template is not supported by llama.cpp")
        if n <= size:
            return c_bytes(buf, n).decode("utf-8", "replace")
        size = n
    raise TemplateError("chat template output did not fit")
