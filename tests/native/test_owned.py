"""The binding's one owning-pointer lifecycle (:mod:`llamapy._native.owned`), shared by Model,
Context, SamplerChain and LoraAdapter: freed once, typed errors after close and for NULL."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from llamapy._native import native
from llamapy._native.owned import Owned, not_null
from llamapy.errors import ClosedError, NativeError


class Thing(Owned):
    KIND = "thing"

    def __init__(self, freed: list[Any], ptr: Any = "p") -> None:
        self._ptr, self.freed = ptr, freed

    def _free(self, ptr: Any) -> None:
        self.freed.append(ptr)


class Borrowed(Thing):
    FREE_ON_GC = False  # freed by its owner, as a LoRA adapter by its model


def test_close_frees_once_and_the_pointer_is_gone_after() -> None:
    freed: list[Any] = []
    with Thing(freed) as thing:
        assert thing.ptr == "p" and not thing.closed
    assert freed == ["p"] and thing.closed
    thing.close()
    assert freed == ["p"]
    with pytest.raises(ClosedError, match="thing is closed"):
        thing.ptr  # noqa: B018


def test_an_unclosed_wrapper_is_freed_when_collected_unless_another_frees_it() -> None:
    freed: list[Any] = []
    Thing(freed, "a")
    Borrowed(freed, "b")
    gc.collect()
    assert freed == ["a"]


def test_a_null_pointer_is_the_given_error_made_only_then() -> None:
    made: list[str] = []

    def error() -> NativeError:
        made.append("made")
        return NativeError("no such thing")

    assert not_null("p", error) == "p" and made == []
    with pytest.raises(NativeError, match="no such thing"):
        not_null(native().ffi.NULL, error)
    assert made == ["made"]
