"""The runtime between the engine and everything above it.

One owner per engine (:class:`TickLoop`, a dedicated thread, or :class:`InlineRuntime`, the
caller's thread) and one event client (:class:`RequestStream`, :class:`AsyncRequestStream`)
used by ``Server``, ``Session`` and the API adapters. See :mod:`llamapy.runtime.base`.
"""

from llamapy.runtime.base import Runtime
from llamapy.runtime.client import (
    AsyncRequestStream,
    AsyncTextChunks,
    Collector,
    Completion,
    RequestStream,
    TextChunks,
    Usage,
    new_request_id,
    raise_for,
)
from llamapy.runtime.handles import MAX_BUFFERED_EVENTS, is_final
from llamapy.runtime.inline import InlineRuntime
from llamapy.runtime.loop import Hosted, LoopState, TickLoop

__all__ = [
    "MAX_BUFFERED_EVENTS",
    "AsyncRequestStream",
    "AsyncTextChunks",
    "Collector",
    "Completion",
    "Hosted",
    "InlineRuntime",
    "LoopState",
    "RequestStream",
    "Runtime",
    "TextChunks",
    "TickLoop",
    "Usage",
    "is_final",
    "new_request_id",
    "raise_for",
]
