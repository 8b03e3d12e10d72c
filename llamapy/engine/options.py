"""The engine's options, defined in the option tree (:mod:`llamapy.options`) and re-exported.

``SamplingParams`` mirrors llama-server's sampling defaults (``common_params_sampling``).
``EngineConfig`` holds the server-level scheduling options, ``RequestOptions`` the per-request
ones. Callers that forward user options select them with :func:`sampling_option_keys`,
:func:`request_option_keys` and :func:`engine_option_keys` and build the dataclasses with
:func:`resolve_request_options` / :func:`make_engine_config`, which raise
:class:`~llamapy.errors.UnknownOptionError` for unknown keys instead of dropping them.
"""

from __future__ import annotations

from llamapy.options.engine import (
    EngineConfig,
    EngineTuning,
    engine_option_keys,
    make_engine_config,
)
from llamapy.options.sampling import (
    LLAMA_DEFAULT_SEED,
    RequestOptions,
    SamplingParams,
    request_option_keys,
    resolve_request_options,
    sampling_option_keys,
)

__all__ = [
    "LLAMA_DEFAULT_SEED",
    "EngineConfig",
    "EngineTuning",
    "RequestOptions",
    "SamplingParams",
    "engine_option_keys",
    "make_engine_config",
    "request_option_keys",
    "resolve_request_options",
    "sampling_option_keys",
]
