"""The runtime between the engine and everything above it.

One owner per engine (:class:`TickLoop`, a dedicated thread, or :class:`InlineRuntime`, the
caller's thread) and one event client (:class:`RequestStream`, :class:`AsyncRequestStream`:
submitted when made) used by ``Server``, ``Session`` and the API adapters, with the stream
objects the public API returns (:class:`EventStream`, :class:`TextChunks` and their async
twins: submitted at the first iteration). See :mod:`llamapy.runtime.base`.
"""

from llamapy.runtime.base import Runtime
from llamapy.runtime.client import (
    AsyncRequestStream,
    Collector,
    Completion,
    RequestStream,
    Usage,
    new_request_id,
    raise_for,
)
from llamapy.runtime.handles import MAX_BUFFERED_EVENTS, is_final
from llamapy.runtime.hosting import Hosted, LoopState
from llamapy.runtime.inline import InlineRuntime
from llamapy.runtime.loop import TickLoop
from llamapy.runtime.model_info import MediaEncoding, ModelInfo
from llamapy.runtime.streams import (
    AsyncEventStream,
    AsyncTextChunks,
    EventStream,
    PendingStreams,
    TextChunks,
)

__all__ = [
    "MAX_BUFFERED_EVENTS",
    "AsyncEventStream",
    "AsyncRequestStream",
    "AsyncTextChunks",
    "Collector",
    "Completion",
    "EventStream",
    "Hosted",
    "InlineRuntime",
    "LoopState",
    "MediaEncoding",
    "ModelInfo",
    "PendingStreams",
    "RequestStream",
    "Runtime",
    "TextChunks",
    "TickLoop",
    "Usage",
    "is_final",
    "new_request_id",
    "raise_for",
]
