"""llama.cpp's built-in chat template names as Jinja templates of our own.

llama-server's ``--chat-template NAME`` accepts the names of the templates llama.cpp ships in
C++ (``chatml``, ``llama3``, ...). llamapy always renders Jinja, so each name it supports is
written here as the Jinja source that renders the same prompt; :data:`BUILTIN_TEMPLATES` maps
the name to it. A name not listed is not a built-in (``--chat-template`` then reads a file path
or Jinja source).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from llamapy.chat.template import CHATML_TEMPLATE

__all__ = ["BUILTIN_TEMPLATES"]

_LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

# Gemma has no system role: llama.cpp prepends system text to the next user turn.
_GEMMA = (
    "{{ bos_token }}{% set ns = namespace(system='') %}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = ns.system + message['content']"
    " | trim + '\\n\\n' %}{% else %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role'])"
    " + '\\n' + (ns.system if message['role'] == 'user' else '') + message['content'] | trim"
    " + '<end_of_turn>\\n' }}{% if message['role'] == 'user' %}{% set ns.system = '' %}{% endif %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)

_PHI3 = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

_ZEPHYR = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

#: Built-in template name -> Jinja source.
BUILTIN_TEMPLATES: Mapping[str, str] = MappingProxyType({
    "chatml": CHATML_TEMPLATE,
    "llama3": _LLAMA3,
    "gemma": _GEMMA,
    "phi3": _PHI3,
    "zephyr": _ZEPHYR,
})
