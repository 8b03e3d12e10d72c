"""llama.cpp's built-in chat template names as Jinja templates of our own.

llama-server's ``--chat-template NAME`` accepts the names of the templates llama.cpp ships in
C++ (``chatml``, ``llama3``, ...). llamapy always renders Jinja, so each name it supports is
written here as the Jinja source that renders the same prompt; :data:`BUILTIN_TEMPLATES` maps
the name to it. :data:`LLAMA_CPP_NAMES` lists every name llama.cpp knows (``src/llama-chat.cpp``
of the pinned source): one of those without a Jinja twin here is refused with a clear error,
never taken for Jinja source (which would render the name itself as the prompt). Any other
value is not a built-in (``--chat-template`` then reads a file path or Jinja source).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["BUILTIN_TEMPLATES", "CHATML_TEMPLATE", "LLAMA_CPP_NAMES"]

#: Plain ChatML (``chatml``).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

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

# Cohere's Command-R: system, user and chatbot turns, contents trimmed.
_COMMAND_R = (
    "{% for message in messages %}{% if message['role'] in ('system', 'user', 'assistant') %}"
    "{{ '<|START_OF_TURN_TOKEN|><|' + {'system': 'SYSTEM', 'user': 'USER', 'assistant':"
    " 'CHATBOT'}[message['role']] + '_TOKEN|>' + message['content'] | trim"
    " + '<|END_OF_TURN_TOKEN|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}"
)


def _mistral_v7(space: str) -> str:
    """Mistral's v7 template (``space``: " " for v7, "" for v7-tekken)."""
    return (
        "{% for message in messages %}{% if message['role'] == 'system' %}"
        f"{{{{ '[SYSTEM_PROMPT]{space}' + message['content'] + '[/SYSTEM_PROMPT]' }}}}"
        f"{{% elif message['role'] == 'user' %}}{{{{ '[INST]{space}' + message['content']"
        f" + '[/INST]' }}}}{{% else %}}{{{{ '{space}' + message['content'] + '</s>' }}}}"
        "{% endif %}{% endfor %}"
    )


_PHI4 = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '<|im_sep|>' + message['content'] + '<|im_end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}"
)

# DeepSeek's markers use FULLWIDTH VERTICAL LINE and LOWER ONE EIGHTH BLOCK characters.
_USER, _ASSISTANT = "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>"
_END = "<\uff5cend\u2581of\u2581sentence\uff5c>"
_DEEPSEEK3 = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ message['content'] + '\\n\\n' }}{% elif message['role'] == 'user' %}"
    f"{{{{ '{_USER}' + message['content'] }}}}{{% elif message['role'] == 'assistant' %}}"
    f"{{{{ '{_ASSISTANT}' + message['content'] + '{_END}' }}}}{{% endif %}}"
    f"{{% endfor %}}{{% if add_generation_prompt %}}{{{{ '{_ASSISTANT}' }}}}{{% endif %}}"
)

#: Built-in template name -> Jinja source.
BUILTIN_TEMPLATES: Mapping[str, str] = MappingProxyType({
    "chatml": CHATML_TEMPLATE,
    "llama3": _LLAMA3,
    "gemma": _GEMMA,
    "phi3": _PHI3,
    "zephyr": _ZEPHYR,
    "command-r": _COMMAND_R,
    "mistral-v7": _mistral_v7(" "),
    "mistral-v7-tekken": _mistral_v7(""),
    "phi4": _PHI4,
    "deepseek3": _DEEPSEEK3,
})

#: Every built-in name of llama.cpp's ``LLM_CHAT_TEMPLATES``.
LLAMA_CPP_NAMES = frozenset({
    "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1",
    "mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4",
    "falcon3", "zephyr", "monarch", "gemma", "orion", "openchat", "vicuna", "vicuna-orca",
    "deepseek", "deepseek2", "deepseek3", "deepseek-ocr", "command-r", "llama3", "chatglm3",
    "chatglm4", "glmedge", "minicpm", "exaone3", "exaone4", "exaone-moe", "rwkv-world",
    "granite", "granite-4.0", "granite-4.1", "gigachat", "megrez", "yandex", "bailing",
    "bailing-think", "bailing2", "llama4", "smolvlm", "hunyuan-moe", "gpt-oss",
    "hunyuan-dense", "hunyuan-vl", "kimi-k2", "seed_oss", "grok-2", "pangu-embedded",
    "solar-open",
})
