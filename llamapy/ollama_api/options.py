"""Ollama's ``options``, ``keep_alive`` and model names, mapped onto llamapy's.

- ``options`` become engine request options by the option tree's own names
  (:data:`OPTION_NAMES`: ``temperature`` -> ``temp``, ``repeat_penalty`` -> ``penalty_repeat``,
  ...), so their defaults and ranges are the tree's (a value out of range is a 400 when the
  request is resolved). ``num_predict`` is the token budget: -1 (no limit) and -2 (fill the
  context) both mean the rest of the per-slot context. ``num_ctx`` is accepted when it fits the
  served per-slot context (it cannot grow it: a larger one is a 400). ``num_keep`` is accepted
  and changes nothing (llamapy never shifts the context). Ollama's load-time parameters
  (:data:`LOAD_OPTIONS`) and unknown keys are ignored with a logged warning, as Ollama ignores
  them.
- ``keep_alive``: seconds or a duration (``"5m"``), 0 = unload after the request, negative =
  keep forever (:func:`~llamapy.server.parse_keep_alive`).
- Model names: Ollama clients send ``name:tag``; ``:latest`` is optional
  (:func:`resolve_name`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ..errors import InvalidOptionError, ModelNotFoundError
from ..openai_api.target import ServedModel
from ..server import parse_keep_alive
from .params import Options

log = logging.getLogger("llamapy.ollama")

#: Ollama option -> engine request option (the option tree's name).
OPTION_NAMES = {
    "temperature": "temp", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
    "typical_p": "typical_p", "seed": "seed", "repeat_penalty": "penalty_repeat",
    "repeat_last_n": "penalty_last_n", "presence_penalty": "penalty_present",
    "frequency_penalty": "penalty_freq", "mirostat": "mirostat", "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta", "stop": "stop",
}
#: Options Ollama applies when it loads a model: the served model's start options decide here.
LOAD_OPTIONS = frozenset({
    "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
    "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread", "penalize_newline",
    "tfs_z"})
#: Options read elsewhere (the budget, the context check) or accepted without effect.
BUDGET_OPTIONS = frozenset({"num_predict", "num_ctx", "num_keep"})
#: The tag a bare model name stands for.
DEFAULT_TAG = ":latest"


def engine_options(options: Options | None) -> dict[str, Any]:
    """The engine request options of ``options`` (the ignored ones logged)."""
    if options is None:
        return {}
    given = options.model_dump(exclude_none=True)
    ignored = sorted(key for key in given if key in LOAD_OPTIONS)
    unknown = sorted(options.model_extra or {})
    if ignored:
        log.warning("ollama options ignored (fixed when the server starts): %s",
                    ", ".join(ignored))
    if unknown:
        log.warning("unknown ollama options ignored: %s", ", ".join(unknown)[:500])
    return {OPTION_NAMES[key]: value for key, value in given.items() if key in OPTION_NAMES}


def token_budget(num_predict: int | None, prompt_tokens: int, n_ctx_seq: int,
                 default: int) -> int:
    """``max_tokens`` for ``num_predict`` (None: ``default``, the server's; -1 / -2: the rest
    of the context)."""
    if num_predict is None:
        return default
    if num_predict < 0:
        return max(1, n_ctx_seq - prompt_tokens) if n_ctx_seq else default
    return num_predict


def check_num_ctx(options: Options | None, n_ctx_seq: int) -> None:
    """A 400 unless ``num_ctx`` (when given) fits the served per-slot context."""
    num_ctx = options.num_ctx if options is not None else None
    if num_ctx is not None and n_ctx_seq and num_ctx > n_ctx_seq:
        raise InvalidOptionError(
            f"num_ctx {num_ctx} is larger than the served context per request ({n_ctx_seq}); "
            "start the server with a larger --ctx-size or fewer --parallel slots",
            option="options.num_ctx")


def keep_alive(value: object) -> float | None:
    """``keep_alive`` in seconds (None when not given; -1 for forever)."""
    if value is None:
        return None
    seconds = parse_keep_alive(value)
    return -1.0 if seconds == float("inf") else seconds


def served_name(served: ServedModel, requested: str) -> str:
    """The served model's name ``requested`` means (any name with ``accept_any_model``)."""
    if served.accept_any_model:
        return served.name
    return resolve_name(requested, served.names)


def resolve_name(requested: str, names: Iterable[str]) -> str:
    """The served name ``requested`` means (exactly, or without its ``:latest`` tag); a 404
    in Ollama's words otherwise."""
    known = set(names)
    for candidate in (requested, requested.removesuffix(DEFAULT_TAG)):
        if candidate in known:
            return candidate
    raise ModelNotFoundError(f"model {requested!r} not found")
