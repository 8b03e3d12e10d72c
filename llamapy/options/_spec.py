"""How an option is declared: a dataclass field with a default and a one-line help text.

Every option dataclass of :mod:`llamapy.options` declares its fields with :func:`option` (or
:func:`option_factory` for mutable defaults), so the name, type, default and help text of an
option live in one place; CLI flags, key lists and the keyword ``TypedDict`` of
:mod:`llamapy.options.typed` are generated from them. ``accepts`` names the type a caller may
pass when it is wider than the stored one (``stop`` takes a string or a list and stores a
tuple).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, TypeVar

from llamapy.errors import InvalidOptionError

T = TypeVar("T")

__all__ = ["field_default", "field_help", "field_input_type", "option", "option_factory",
           "option_names", "required"]


def option(default: T, help: str, *, flags: tuple[str, ...] = (), accepts: str = "") -> T:
    """A field with ``default`` and a one-line ``help``; ``flags`` adds CLI spellings,
    ``accepts`` the type a caller may pass when it is wider than the field's (see the module)."""
    return dataclasses.field(default=default,
                             metadata={"help": help, "flags": flags, "accepts": accepts})


def option_factory(factory: Callable[[], T], help: str, *, flags: tuple[str, ...] = (),
                   accepts: str = "") -> T:
    """A field whose default is built by ``factory`` (mutable or frozen collections)."""
    return dataclasses.field(default_factory=factory,
                             metadata={"help": help, "flags": flags, "accepts": accepts})


def required(help: str) -> Any:
    """A field without a default (the caller must give it)."""
    return dataclasses.field(metadata={"help": help, "flags": ()})


def option_names(cls: type, *, exclude: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The field names of an option dataclass, in declaration order, minus ``exclude``."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in exclude)


def field_help(f: dataclasses.Field[Any]) -> str:
    """The help text of an option field ("" if it has none)."""
    return str(f.metadata.get("help", ""))


def field_input_type(f: dataclasses.Field[Any]) -> str:
    """The type a caller may pass for an option field, as source text: its ``accepts``, else
    its annotation."""
    accepts = str(f.metadata.get("accepts", ""))
    return accepts or (f.type if isinstance(f.type, str) else getattr(f.type, "__name__", ""))


def default_of(cls: type, name: str) -> Any:
    """The default of option ``name`` of the option dataclass ``cls``: for a value elsewhere
    (an API's own config) that must default as the option tree says."""
    return field_default(next(f for f in dataclasses.fields(cls) if f.name == name))


def field_default(f: dataclasses.Field[Any]) -> Any:
    """The default of an option field (built, for a factory; None when it has none)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def check(ok: bool, option: str, message: str) -> None:
    """Raise :class:`InvalidOptionError` for ``option`` unless ``ok``."""
    if not ok:
        raise InvalidOptionError(f"{option}: {message}", option=option)


def is_int(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_num(value: object) -> bool:
    """An int or a float that is not NaN (and not a bool)."""
    return (is_int(value) or isinstance(value, float)) and not (
        isinstance(value, float) and math.isnan(value)
    )


def is_finite(value: object) -> bool:
    """A number (not a bool) that is finite as a double (an int past its range is not)."""
    if not is_num(value):
        return False
    try:
        return math.isfinite(value)  # type: ignore[arg-type]
    except OverflowError:
        return False


def check_typed_fields(obj: Any) -> None:
    """Check every ``int``/``float``-annotated field of an option dataclass instance (a float
    must be finite: no option means anything at infinity)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.type == "float":
            check(is_finite(value), f.name, f"expected a finite number, got {value!r}")
        elif f.type == "int":
            check(is_int(value), f.name, f"expected an integer, got {value!r}")
