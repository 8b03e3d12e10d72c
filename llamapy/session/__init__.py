"""Workspace sessions: a stable prefix kept hot on a leased slot, a volatile suffix, decode.

``server.open_session(config)`` shares a :class:`~llamapy.server.Server` (sessions batch with
other traffic); :func:`open_standalone` runs a single-user session on a ``Model`` with its own
context and tick thread. Both run on the runtime (:mod:`llamapy.runtime`); a session never
touches the engine's backend. Every blocking primitive takes a whole-call ``timeout=`` and has
an async twin (``aensure_prefix``, ``adecode``, ...); ``session.cancel()`` stops the call in
flight from any thread or task. :func:`open_path` opens a session on a model file and
:func:`embed_path` embeds a text with one (through a registrable :class:`EmbedFunc`).
"""

from llamapy.session.config import (
    AdapterSpec,
    ContextReport,
    DecodeConfig,
    PrefixInput,
    PrefixSegment,
    PrefixStatus,
    SessionConfig,
    StreamChunk,
    StructuredOutput,
    SuffixInput,
    SuffixStatus,
    check_shared,
    standalone_context_options,
)
from llamapy.session.embed_func import (
    EmbedFunc,
    close_embedders,
    embed_path,
    native_embed,
    register_embed_func,
)
from llamapy.session.factory import SessionFactory, open_path
from llamapy.session.host import InlineHost, ServerHost, SessionHost
from llamapy.session.manifest import ContextManifest, ManifestSegment, file_digest
from llamapy.session.prefill import PrefillProgress, ProgressCallback
from llamapy.session.session import Session
from llamapy.session.snapshot import SessionSnapshot
from llamapy.session.standalone import aopen_standalone, open_standalone
from llamapy.session.streams import AsyncDecodeStream, DecodeStream

__all__ = [
    "AdapterSpec",
    "AsyncDecodeStream",
    "ContextManifest",
    "ContextReport",
    "DecodeConfig",
    "DecodeStream",
    "EmbedFunc",
    "InlineHost",
    "ManifestSegment",
    "PrefillProgress",
    "PrefixInput",
    "PrefixSegment",
    "PrefixStatus",
    "ProgressCallback",
    "ServerHost",
    "Session",
    "SessionConfig",
    "SessionFactory",
    "SessionHost",
    "SessionSnapshot",
    "StreamChunk",
    "StructuredOutput",
    "SuffixInput",
    "SuffixStatus",
    "aopen_standalone",
    "check_shared",
    "close_embedders",
    "embed_path",
    "file_digest",
    "native_embed",
    "open_path",
    "open_standalone",
    "register_embed_func",
    "standalone_context_options",
]
