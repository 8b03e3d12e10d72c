"""Other spellings of our options: the OpenAI / llama-server alias table, reasoning formats.

:data:`ALIASES` maps a foreign name to the option it means (``temperature`` -> ``temp``). The
HTTP layer renames request fields through it, llama-server's ``/completion`` reads its token
budget spellings from it and a session's ``DecodeConfig`` (OpenAI spelling) maps onto
``SamplingParams`` with it. The engine itself accepts only the canonical names.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from llamapy.errors import UnsupportedFeatureError

__all__ = ["ALIASES", "REASONING_FORMATS", "aliases_of", "canonical_name",
           "check_reasoning_format"]

#: Foreign name -> canonical option name (``SamplingParams`` / ``RequestOptions`` fields).
ALIASES: Mapping[str, str] = MappingProxyType({
    "temperature": "temp",
    "repeat_penalty": "penalty_repeat",
    "frequency_penalty": "penalty_freq",
    "presence_penalty": "penalty_present",
    "repeat_last_n": "penalty_last_n",
    "typ_p": "typical_p",
    "n_predict": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "id_slot": "slot_id",
    "reasoning_budget_tokens": "reasoning_budget",
    "thinking_budget_tokens": "reasoning_budget",
})

#: ``reasoning_format`` values (llama-server's): ``auto`` and ``deepseek`` separate the
#: reasoning (``reasoning_content`` / a session's ``thinking``); ``none`` leaves it in the text.
REASONING_FORMATS = ("auto", "deepseek", "none")


def canonical_name(name: str) -> str:
    """The option ``name`` means (``name`` itself when it is no alias)."""
    return ALIASES.get(name, name)


def aliases_of(name: str) -> tuple[str, ...]:
    """The foreign spellings of option ``name``, in table order."""
    return tuple(alias for alias, target in ALIASES.items() if target == name)


def check_reasoning_format(value: object) -> str:
    """``value`` if it is one of :data:`REASONING_FORMATS`, else
    :class:`~llamapy.errors.UnsupportedFeatureError` (feature ``reasoning_format:<value>``)."""
    if value not in REASONING_FORMATS:
        raise UnsupportedFeatureError(
            f"reasoning_format:{value}",
            f"unsupported reasoning_format {value!r} (one of {', '.join(REASONING_FORMATS)})")
    return str(value)
