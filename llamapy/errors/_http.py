"""Errors of the HTTP layer: malformed, unauthenticated, refused and unrouted requests."""

from __future__ import annotations

from llamapy.errors._tree import LlamapyError

# --- HTTP ----------------------------------------------------------------------------------------


class InvalidRequestError(LlamapyError, ValueError):
    """An HTTP request is malformed (body is not JSON, wrong content)."""

    http_status = 400
    error_type = "invalid_request_error"


class AuthenticationError(LlamapyError):
    """A request to a key-protected server lacks a valid ``Authorization: Bearer`` key."""

    http_status = 401
    error_type = "authentication_error"


class PayloadTooLargeError(LlamapyError):
    """A request body exceeds the server's limit; ``limit`` is that limit in bytes."""

    http_status = 413
    error_type = "invalid_request_error"

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"request body exceeds the limit of {limit} bytes")


class UnsupportedMediaTypeError(InvalidRequestError):
    """A request body whose ``Content-Type`` the route does not take (415): the API routes take
    JSON; ``content_type`` is the header as sent (empty when absent)."""

    http_status = 415

    def __init__(self, content_type: str) -> None:
        self.content_type = content_type
        super().__init__(f"unsupported Content-Type {content_type!r}: send the body as "
                         "application/json")


class ForbiddenRequestError(LlamapyError):
    """A request refused for where it comes from, whatever its key (403): see
    :mod:`llamapy.serve.guard`."""

    http_status = 403
    error_type = "permission_error"


class PermissionDeniedError(LlamapyError):
    """The request's API key may not see or act on this (403): a tenant key asked for what is
    an admin's (``/metrics`` when keys carry tenants) or acted on another tenant's slot or slot
    file. The message never names the other tenant, its scope or its ids."""

    http_status = 403
    error_type = "permission_error"


class SlotFileBudgetError(PermissionDeniedError):
    """A slot save refused by a slot-file budget (403; see
    :mod:`llamapy.serve.slot_store`): the save would pass the bound of serving option
    ``option`` (``limit`` bytes or files); nothing was written. A quota that frees only when
    files go, so neither a 429 (a client would retry it) nor a 413 (the request is small)."""

    def __init__(self, option: str, limit: int, what: str) -> None:
        self.option = option
        self.limit = limit
        super().__init__(f"Unable to save slot: {what} would pass the slot-file budget "
                         f"{option}={limit}; overwrite an existing file instead, or ask the "
                         "operator for room")


class HostNotAllowedError(ForbiddenRequestError):
    """The ``Host`` header names a host the server does not answer to (a DNS-rebinding page
    sends its own name); ``host`` is the header as sent."""

    def __init__(self, host: str) -> None:
        self.host = host
        super().__init__(f"Host {host!r} is not allowed; if this server is reached under that "
                         "name, start it with --allowed-hosts NAME")


class OriginNotAllowedError(ForbiddenRequestError):
    """A cross-origin page's request that may change state (not ``GET``) from an origin the
    CORS policy does not allow; ``origin`` is the ``Origin`` header as sent."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        super().__init__(f"Origin {origin!r} is not allowed to send this request; allow it with "
                         "--cors-origins ORIGIN")


class RouteNotFoundError(LlamapyError):
    """No endpoint at the requested path (or not with that method)."""

    http_status = 404
    error_type = "invalid_request_error"


class EndpointDisabledError(LlamapyError):
    """An endpoint turned off at start (``--no-slots``, ``--no-metrics``): llama-server's 501."""

    http_status = 501
    error_type = "not_supported_error"


class StoredObjectNotFoundError(LlamapyError):
    """A stored response, conversation or item id names nothing this tenant may read (an
    unknown id, an expired or deleted one, or another tenant's: all look the same)."""

    http_status = 404
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, option: str | None = None, code: str = "not_found"
                 ) -> None:
        super().__init__(message)
        self.option = option
        self.code = code
