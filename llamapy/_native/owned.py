"""One lifecycle for the wrappers that own a native pointer (model, context, sampler chain,
LoRA adapter): a NULL from a constructor is a typed error, ``ptr`` raises
:class:`~llamapy.errors.ClosedError` once the object is closed, ``close()`` frees it once
(idempotent), ``with`` closes it, and a wrapper garbage-collected unclosed frees it too,
unless its native object is freed by another's (a LoRA adapter's by its model's)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from ..errors import ClosedError, LlamapyError
from ._loader import native

__all__ = ["Owned", "not_null"]

OwnedT = TypeVar("OwnedT", bound="Owned")


def not_null(ptr: Any, error: Callable[[], LlamapyError]) -> Any:
    """``ptr``, or ``error()`` raised when a native call returned NULL (``error`` is called
    only then: it may read the captured log lines)."""
    if ptr == native().ffi.NULL:
        raise error()
    return ptr


class Owned:
    """Base of a wrapper owning one native object: subclasses set ``_ptr`` and implement
    :meth:`_free`; ``KIND`` names the object in errors."""

    KIND: ClassVar[str] = "native object"
    #: Whether the object is freed when the wrapper is garbage-collected unclosed.
    FREE_ON_GC: ClassVar[bool] = True
    _ptr: Any = None

    @property
    def ptr(self) -> Any:
        """The raw pointer; raises :class:`~llamapy.errors.ClosedError` after close."""
        if self.closed:
            raise ClosedError(f"{self.KIND} is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._ptr is None

    def close(self) -> None:
        """Free the native object. Idempotent."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._free(ptr)

    def _free(self, ptr: Any) -> None:
        raise NotImplementedError

    def __enter__(self: OwnedT) -> OwnedT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a safety net only; close() is the contract
        if self.FREE_ON_GC:
            with contextlib.suppress(Exception):
                self.close()
