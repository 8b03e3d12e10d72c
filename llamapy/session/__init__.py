"""Workspace sessions: a stable prefix kept hot on a leased slot, a volatile suffix, decode.

``server.open_session(config)`` shares a :class:`~llamapy.server.Server` (sessions batch with
other traffic); :func:`open_standalone` runs a single-user session on a ``Model`` with its own
context and tick thread. Both run on the runtime (:mod:`llamapy.runtime`); a session never
touches the engine's backend.
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
from llamapy.session.factory import SessionFactory, open_path
from llamapy.session.host import InlineHost, ServerHost, SessionHost
from llamapy.session.manifest import ContextManifest, ManifestSegment, file_digest
from llamapy.session.session import Session
from llamapy.session.snapshot import SessionSnapshot
from llamapy.session.standalone import open_standalone

__all__ = [
    "AdapterSpec",
    "ContextManifest",
    "ContextReport",
    "DecodeConfig",
    "InlineHost",
    "ManifestSegment",
    "PrefixInput",
    "PrefixSegment",
    "PrefixStatus",
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
    "check_shared",
    "file_digest",
    "open_path",
    "open_standalone",
    "standalone_context_options",
]
