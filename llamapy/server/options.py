"""Server start options, defined in the option tree (:mod:`llamapy.options.start`).

A ``Server`` takes flat keyword options; :func:`resolve_start_options` splits them by owner
(:class:`ResolvedStart`: server sizing, engine scheduling and sampling defaults, context tuning,
model loading) and raises :class:`~llamapy.errors.UnknownOptionError` for unknown keys
(``vocab_only``, ``n_seq_max`` and ``model_path`` included). The timeout defaults come from
:data:`llamapy.options.TIMEOUTS`.
"""

from __future__ import annotations

from ..options.start import (
    CALL_OPTION_KEYS,
    ResolvedStart,
    ServerOptions,
    call_option_keys,
    resolve_start_options,
    server_request_option_keys,
    start_option_keys,
)
from ..options.timeouts import TIMEOUTS

__all__ = [
    "CALL_OPTION_KEYS",
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_STREAM_TIMEOUT",
    "ResolvedStart",
    "ServerOptions",
    "call_option_keys",
    "resolve_start_options",
    "server_request_option_keys",
    "start_option_keys",
]

#: Default ``timeout`` of a whole blocking call (``complete``/``generate``), seconds.
DEFAULT_CALL_TIMEOUT = TIMEOUTS.call
#: Default ``timeout`` per chunk of ``stream``/``events``, seconds.
DEFAULT_STREAM_TIMEOUT = TIMEOUTS.stream_chunk
