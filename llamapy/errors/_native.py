"""Errors of the native layer: the library, loading, decoding, libllama's exceptions."""

from __future__ import annotations

from llamapy.errors._tree import LlamapyError

# --- native --------------------------------------------------------------------------------------


class NativeError(LlamapyError):
    """A libllama call failed."""


class LibraryNotFoundError(NativeError):
    """libllama (or its generated binding) is missing; run ``python build_lib.py``."""


class LayoutMismatchError(NativeError):
    """The cffi declarations disagree with the C compiler on a struct layout."""


class ModelLoadError(NativeError):
    """libllama could not load a model file (missing, corrupt, unsupported)."""

    http_status = 400


class RpcServerError(ModelLoadError):
    """A ggml RPC server named in ``rpc_servers`` is unreachable or lends no device."""


class DecodeError(NativeError):
    """``llama_decode`` returned an error code; ``code`` is that code."""

    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = code
        super().__init__(message or f"llama_decode failed with code {code}")


class KVCacheFullError(DecodeError):
    """``llama_decode`` returned 1: no KV slot for the batch."""

    def __init__(self) -> None:
        super().__init__(1, "no KV cache slot for the batch (llama_decode returned 1)")


class DecodeAbortedError(DecodeError):
    """``llama_decode`` returned 2: aborted by the abort callback."""

    def __init__(self) -> None:
        super().__init__(2, "decode aborted (llama_decode returned 2)")


class InvalidBatchError(DecodeError):
    """``llama_decode`` returned -1: the batch was invalid."""

    def __init__(self) -> None:
        super().__init__(-1, "invalid batch (llama_decode returned -1)")


#: ``DecodeError.code`` of :class:`DecodeExceptionError` (llama_decode's own codes are > -100).
DECODE_EXCEPTION_CODE = -100


class DecodeExceptionError(DecodeError):
    """``llama_decode`` threw a C++ exception, which llamapy's shim caught: a fatal decode
    error (``code`` is :data:`DECODE_EXCEPTION_CODE`) that fails the batch's runs, as any
    other. ``what`` is the exception's message."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(DECODE_EXCEPTION_CODE, f"llama_decode threw: {what}")


class NativeExceptionError(NativeError):
    """A libllama call threw a C++ exception, which llamapy's shim caught instead of letting it
    end the process: the object the call worked on (a request's sampler chain) is failed, the
    server carries on. ``function`` names the libllama call, ``what`` is the message."""

    def __init__(self, function: str, what: str) -> None:
        self.function = function
        self.what = what
        super().__init__(f"{function} failed: {what}")


class NativeMemoryError(NativeExceptionError):
    """A libllama call ran out of memory (``std::bad_alloc``) building what a request asked
    for (a sampler's window, a grammar); the request fails, the server carries on."""

    http_status = 503


class NoCandidateError(NativeError, ValueError):
    """A request's samplers excluded every token at a step (a grammar that allows none of the
    tokens its ``logit_bias`` leaves, every token biased away): nothing can be sampled. The run
    ends with this error before the pick reaches the grammar."""

    http_status = 400
    error_type = "invalid_request_error"


def decode_error(code: int) -> DecodeError:
    """The typed error for a non-zero ``llama_decode`` return code."""
    if code == 1:
        return KVCacheFullError()
    if code == 2:
        return DecodeAbortedError()
    if code == -1:
        return InvalidBatchError()
    return DecodeError(code, f"fatal llama_decode error {code}")


class ChatParseError(NativeError):
    """The model's output does not read as the chat format its template implies (a tool call
    opened and never finished, arguments that are not the declared schema's). The generation
    ends with this error instead of a half call in the content."""

    http_status = 500
    error_type = "server_error"
