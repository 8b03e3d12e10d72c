"""Every timeout default, in one place: each consumer reads its default from :data:`TIMEOUTS`.

- ``Server.complete``/``generate`` (and async twins): the whole call (:attr:`Timeouts.call`);
- ``Server.stream``/``events``: each chunk or event (:attr:`Timeouts.stream_chunk`);
- ``SessionConfig.lease_timeout``: a session's wait for a free slot (:attr:`Timeouts.lease`);
- ``SessionConfig.lease_idle_timeout``: how long a session's leased slot may sit unused before
  it is reclaimed (:attr:`Timeouts.lease_idle`);
- ``SessionConfig.request_timeout``: each engine event of a session
  (:attr:`Timeouts.session_event`);
- the HTTP/OpenAI API (``ServedModel.request_timeout``, ``--request-timeout``): a request, per
  token when streaming (:attr:`Timeouts.http_request`).
"""

from __future__ import annotations

from dataclasses import dataclass

from llamapy.options._spec import check, is_num, option

__all__ = ["TIMEOUTS", "Timeouts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeouts:
    """Timeout defaults in seconds (each a positive number)."""

    call: float = option(60.0, "a whole blocking generation call")
    stream_chunk: float = option(30.0, "each chunk or event of a stream")
    lease: float = option(30.0, "a session's wait for a free slot")
    lease_idle: float = option(600.0, "a session's leased slot unused this long is reclaimed")
    session_event: float = option(120.0, "a session's wait for each engine event")
    http_request: float = option(600.0, "an HTTP API request (per token when streaming)")

    def __post_init__(self) -> None:
        for name in ("call", "stream_chunk", "lease", "lease_idle", "session_event",
                     "http_request"):
            value = getattr(self, name)
            check(is_num(value) and value > 0, name, f"must be a positive number, got {value!r}")


#: The defaults every consumer uses.
TIMEOUTS = Timeouts()
