"""The base of the exception tree and the errors of options, scheduling, lifecycle, engine and
sessions (see :mod:`llamapy.errors`)."""

from __future__ import annotations

from collections.abc import Iterable

from llamapy.errors._overflow import ContextOverflowDetail


class LlamapyError(Exception):
    """Base of every llamapy error."""

    http_status: int = 500
    #: OpenAI-style error ``type`` for the HTTP layer.
    error_type: str = "server_error"


# --- options and input ---------------------------------------------------------------------------


class InvalidOptionError(LlamapyError, ValueError):
    """An option has an invalid value (a negative ``max_tokens``, an unknown strategy, ...)."""

    http_status = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class UnknownOptionError(InvalidOptionError, TypeError):
    """An option name is not accepted; the message names the valid keys."""

    def __init__(self, unknown: Iterable[str], valid: Iterable[str], *, where: str) -> None:
        self.unknown = sorted(unknown)
        self.valid = sorted(valid)
        names = ", ".join(self.unknown)
        super().__init__(
            f"unknown {where} option(s): {names}; valid keys are: {', '.join(self.valid)}",
            option=self.unknown[0] if self.unknown else None,
        )


class GrammarError(LlamapyError, ValueError):
    """A GBNF grammar (or a schema converted to one) could not be parsed or is unsupported."""

    http_status = 400
    error_type = "invalid_request_error"


class UnsupportedFeatureError(LlamapyError):
    """A deliberately unsupported surface (a schema keyword, a parser protocol, ``n > 1``)."""

    http_status = 400
    error_type = "invalid_request_error"

    def __init__(self, feature: str, message: str | None = None) -> None:
        super().__init__(message or f"unsupported feature: {feature}")
        self.feature = feature


class MediaError(LlamapyError, ValueError):
    """A request's image or audio cannot be used: not an image or audio file llamapy reads,
    larger or more than the server allows, of a kind the model's projector does not take, or
    sent to a model loaded without one. ``reason`` is a short machine-readable word
    (``"no_projector"``, ``"format"``, ``"too_large"``, ``"too_many"``, ``"kind"``,
    ``"decode"``, ``"placement"``)."""

    http_status = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class TemplateError(LlamapyError):
    """A chat template failed to render."""

    http_status = 400
    error_type = "invalid_request_error"


class ContextOverflowError(LlamapyError):
    """Tokens do not fit the context at a given stage.

    ``stage`` names the primitive that would overflow (``"admit"``, ``"prefill"``, ``"decode"``,
    ``"ensure_prefix"``, ``"prefill_suffix"``); ``resident_tokens`` are already in the sequence,
    ``additional_tokens`` are the ones that did not fit, ``n_ctx`` is the limit that applied.
    Its ``error_type`` is llama-server's, so its clients recognise the overflow.
    """

    http_status = 400
    error_type = "exceed_context_size_error"

    def __init__(
        self, *, stage: str, resident_tokens: int, additional_tokens: int, n_ctx: int
    ) -> None:
        self.stage = stage
        self.resident_tokens = resident_tokens
        self.additional_tokens = additional_tokens
        self.n_ctx = n_ctx
        super().__init__(
            f"context overflow at {stage}: {resident_tokens} resident + {additional_tokens} "
            f"additional tokens exceed n_ctx={n_ctx}"
        )

    @property
    def n_prompt_tokens(self) -> int:
        """llama-server's count: the tokens the request needed in the context."""
        return self.resident_tokens + self.additional_tokens

    def overflow_detail(self) -> ContextOverflowDetail:
        """The counts as a value (``as_dict()`` is what an HTTP error body carries)."""
        return ContextOverflowDetail(stage=self.stage, resident_tokens=self.resident_tokens,
                                     additional_tokens=self.additional_tokens, n_ctx=self.n_ctx)


class ManifestMismatchError(LlamapyError):
    """Resident or snapshotted state was made under a different manifest identity."""

    http_status = 409
    error_type = "invalid_request_error"

    def __init__(self, field: str, expected: object, got: object) -> None:
        self.field = field
        self.expected = expected
        self.got = got
        super().__init__(f"manifest mismatch on {field}: expected {expected!r}, got {got!r}")


# --- scheduling ----------------------------------------------------------------------------------


class QueueFullError(LlamapyError):
    """The request queue is at ``max_queue``; nothing was queued."""

    http_status = 429
    error_type = "rate_limit_error"

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        super().__init__(f"request queue is full (max_queue={max_queue})")


class MediaBusyError(QueueFullError):
    """The model's media encoder has ``max_queue`` requests waiting for it already (or one
    waited past its bound): nothing was encoded. Images are encoded one request at a time, and
    the requests waiting for it hold the server's worker threads."""

    def __init__(self, max_queue: int) -> None:
        QueueFullError.__init__(self, max_queue)
        self.args = (f"the media encoder is busy ({max_queue} requests wait for it): "
                     "retry later",)


class MediaMemoryError(MediaBusyError):
    """The media waiting for the model's encoder holds its bound of bytes (``max_bytes``: the
    server's, or one tenant's) and this request's did not fit within its wait: nothing was
    encoded. A 429 (``Retry-After``), as :class:`MediaBusyError`."""

    def __init__(self, max_bytes: int) -> None:
        MediaBusyError.__init__(self, 0)
        self.max_bytes = max_bytes
        self.args = (f"the media waiting for the encoder holds its bound ({max_bytes} bytes): "
                     "retry later",)


class TenantBusyError(QueueFullError):
    """The request's tenant already holds ``tenant_max_requests`` queued or running requests;
    nothing was queued, and other tenants are still admitted. A :class:`QueueFullError` (429,
    ``Retry-After``) for that tenant alone; ``tenant`` is the tenant (None: the default one),
    ``max_requests`` the bound (also as ``max_queue``: the bound that applied)."""

    def __init__(self, tenant: str | None, max_requests: int) -> None:
        self.tenant = tenant
        self.max_requests = max_requests
        self.max_queue = max_requests
        LlamapyError.__init__(self, f"too many requests from this tenant: {max_requests} "
                                    f"queued or running (tenant_max_requests={max_requests})")


class RequestCancelledError(LlamapyError):
    """The *request* was cancelled before it finished: by ``cancel()`` (of its stream, or of
    its id on the server or session), by a client that went away, or by a server closing.

    It is **not** an :class:`asyncio.CancelledError` (nor a subclass): ``except
    asyncio.CancelledError`` does not catch it, and it never cancels the task that awaits the
    request. When that *task* is cancelled instead, :class:`asyncio.CancelledError` propagates
    unchanged (and the request is cancelled too). ``CancelledError`` is an alias of this class.
    """

    http_status = 499
    error_type = "cancelled"


#: The former name of :class:`RequestCancelledError` (the same class).
CancelledError = RequestCancelledError


class RequestTimeoutError(LlamapyError, TimeoutError):
    """A call or a stream's per-token wait ran past its timeout; the request was cancelled."""

    http_status = 504
    error_type = "timeout"


class ClosedError(LlamapyError):
    """The server, session or native object is closed."""

    http_status = 503
    error_type = "server_error"


class SessionClosedError(ClosedError):
    """The workspace session is closed."""

    http_status = 409


class SessionFatalError(LlamapyError):
    """The session's resident state is unknown after a failure; close and reopen it."""

    http_status = 500


class LeaseTimeoutError(LlamapyError, TimeoutError):
    """No slot could be leased for a session within the timeout."""

    http_status = 503
    error_type = "server_error"


class IllegalTransitionError(LlamapyError):
    """An internal state machine was asked for a transition its table does not allow."""

    def __init__(self, machine: str, state: object, event: str) -> None:
        self.machine = machine
        self.state = state
        self.event = event
        super().__init__(f"{machine}: illegal transition {event!r} from state {state!r}")


# --- server lifecycle ----------------------------------------------------------------------------


class NotRunningError(LlamapyError):
    """The server is not running (never started, closed, or died)."""

    http_status = 503


class RuntimeDiedError(NotRunningError):
    """The thread that runs the model ended on an unexpected error (a bug): the server cannot
    serve again, and its process should be restarted. ``cause`` is that error."""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause
        super().__init__(f"the model's thread died: {type(cause).__name__}: {cause}")


class NotReadyError(LlamapyError):
    """The server is still loading its model."""

    http_status = 503


class ReplicaUnavailableError(LlamapyError):
    """The replica serving a request died or became unreachable before answering (a Ray Serve
    deployment, :mod:`llamapy.ray`); ``replica`` names it when known. Retrying may land on
    another replica."""

    http_status = 503

    def __init__(self, message: str, *, replica: str | None = None) -> None:
        super().__init__(message)
        self.replica = replica


class LoadFailedError(LlamapyError):
    """The model could not be loaded; ``reason`` says why."""

    http_status = 503

    def __init__(self, reason: object) -> None:
        self.reason = reason
        super().__init__(f"model load failed: {reason}")


class ModelNotFoundError(LlamapyError):
    """A model name or path does not resolve to a model."""

    http_status = 404
    error_type = "invalid_request_error"


class UnknownModelError(ModelNotFoundError):
    """A request named a model this server does not serve; ``served`` lists those it does."""

    def __init__(self, name: str, served: Iterable[str]) -> None:
        self.name = name
        self.served = tuple(served)
        super().__init__(f"model {name!r} is not served; served models: "
                         f"{', '.join(self.served) or '(none)'}")


class ModelBudgetError(LlamapyError):
    """A model cannot be loaded within the memory budget (``models_max`` / ``memory_mb``):
    it is larger than the budget, or every loaded model is in use or pinned until the wait
    ends."""

    http_status = 503


# --- engine ------------------------------------------------------------------------------------


class EngineError(LlamapyError):
    """A scheduling step failed with a foreign error (a user batch strategy that raised, a
    backend that raised something other than a ``DecodeError``): the requests it touched end
    with this error, the engine keeps serving. ``phase`` names the step, ``__cause__`` holds
    the original exception."""

    def __init__(self, phase: str, cause: BaseException) -> None:
        self.phase = phase
        super().__init__(f"engine {phase} failed: {type(cause).__name__}: {cause}")
        self.__cause__ = cause


class SamplingTooCostlyError(LlamapyError):
    """Sampling one token of a request took longer than the server's ``max_sample_ms`` (a
    grammar too complex to apply at every token): the request ends, the others go on."""

    http_status = 400
    error_type = "invalid_request_error"

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        super().__init__(f"sampling one token took longer than {limit_s * 1000:.0f} ms "
                         "(max_sample_ms); simplify the grammar")


class TriggerTooCostlyError(SamplingTooCostlyError):
    """Matching a request's ``grammar_triggers`` cost more than ``limit_s`` of the model's
    thread a token (patterns linear in time but with a large constant): the request ends, the
    others go on."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        LlamapyError.__init__(self, f"matching grammar_triggers took more than "
                              f"{limit_s * 1000:g} ms a token; simplify the patterns")


class UnknownLeaseError(LlamapyError, KeyError):
    """A lease id that the engine never issued or that was already released."""

    http_status = 409
    error_type = "invalid_request_error"

    def __init__(self, lease_id: object) -> None:
        self.lease_id = lease_id
        super().__init__(f"unknown or released lease {lease_id!r}")

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class SlotBusyError(LlamapyError):
    """A slot action (save, restore, erase) on a slot that is running a request or leased."""

    http_status = 409
    error_type = "invalid_request_error"

    def __init__(self, slot_id: int) -> None:
        self.slot_id = slot_id
        super().__init__(f"slot {slot_id} is busy (running a request or leased); retry when "
                         "it is idle")


# --- sessions ------------------------------------------------------------------------------------


class SessionBusyError(LlamapyError):
    """A session primitive was called while a decode stream of the session is still open."""

    http_status = 409
    error_type = "invalid_request_error"


class LeaseExpiredError(SessionClosedError):
    """The session's leased slot was reclaimed after it sat idle past the session's
    ``lease_idle_timeout``; the session is closed (its KV stays cached in its scope: a new
    session reuses it)."""

    error_type = "invalid_request_error"


class SnapshotFormatError(LlamapyError, ValueError):
    """A session snapshot file is not in the documented format (magic, version, checksum)."""

    http_status = 400
    error_type = "invalid_request_error"


class DiskCacheFormatError(LlamapyError, ValueError):
    """A disk prompt cache file is not in the documented format (magic, version, lengths,
    checksums). The cache skips and removes such a file; this never reaches a request."""

    http_status = 500
