"""The shim's statuses and the one function that turns them into llamapy's errors.

libllama is C++: some of its calls throw, and an exception that leaves a C function called
through cffi ends the process. ``shim/llamapy_shim.cpp`` (built by ``build_lib.py`` next to
libllama) wraps each call that can throw from a request's input in try/catch and returns a
status, with the exception's message copied into a ``what`` buffer; :func:`check_error` maps
the status to a typed error. Its sampling call also checks the pick before accepting it (a
grammar that no token satisfies would otherwise abort the process, which no catch stops).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from ..errors import (
    DecodeExceptionError,
    GrammarError,
    LlamapyError,
    NativeError,
    NativeExceptionError,
    NativeMemoryError,
    NoCandidateError,
)
from ._loader import native

#: Bytes of a ``what`` buffer (a longer message is cut).
WHAT_SIZE = 512
#: Calls whose only input is a grammar: what they throw is the grammar's fault.
_GRAMMAR_CALLS = frozenset({"llama_sampler_init_grammar"})


class Status(IntEnum):
    """``enum llamapy_status`` of ``shim/llamapy_shim.h``."""

    OK = 0
    EXCEPTION = 1
    NO_MEMORY = 2
    UNKNOWN = 3
    NO_CANDIDATE = 4
    NO_LOGITS = 5


def what_buffer() -> Any:
    """A buffer for a shim call's ``what`` (pass it with :data:`WHAT_SIZE`)."""
    return native().ffi.new("char[]", WHAT_SIZE)


def check_error(status: int, what: Any, function: str) -> None:
    """Raise the typed error for ``status``, returned by the shim's wrapper of the libllama
    call ``function`` with message buffer ``what``; return for ``Status.OK``."""
    if status != Status.OK:
        raise shim_error(status, native().ffi.string(what).decode("utf-8", "replace"), function)


def shim_error(status: int, what: str, function: str) -> LlamapyError:
    """The error for a failed shim call (see :func:`check_error`)."""
    if status == Status.NO_CANDIDATE:
        return NoCandidateError(what)
    if status == Status.NO_LOGITS:
        return NativeError(f"{function}: {what}")
    if function == "llama_decode":
        return DecodeExceptionError(what)
    if status == Status.NO_MEMORY:
        return NativeMemoryError(function, what)
    if function in _GRAMMAR_CALLS:
        return GrammarError(f"invalid grammar: {what}")
    return NativeExceptionError(function, what)
