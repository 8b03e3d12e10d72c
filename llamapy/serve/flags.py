"""Command-line flags for every ``Server`` start option, generated from the option dataclasses.

:func:`llamapy.server.start_option_keys` is the authority on which options exist; the
dataclasses that define them (server sizing, engine scheduling, sampling defaults, context
tuning, model loading) give each one's type and default. ``n_ctx`` becomes ``--n-ctx``; a bool
option becomes ``--name/--no-name`` (``--no-cache-prompt``, ``--no-kv-unified``); tuples take
comma-separated values or a JSON list; mappings take JSON. Only flags given on the command line
are passed to ``Server``, so its own defaults apply otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from .._native.context import ContextOptions
from .._native.model import ModelOptions
from ..engine.options import EngineConfig, SamplingParams
from ..server import start_option_keys
from ..server.options import ServerOptions

#: Option owners, in the order their flags are grouped (first owner of a name wins).
OWNERS: tuple[tuple[type, str], ...] = (
    (ServerOptions, "server sizing"),
    (EngineConfig, "scheduling and prompt cache"),
    (SamplingParams, "sampling defaults (requests may override them)"),
    (ContextOptions, "context tuning"),
    (ModelOptions, "model loading"),
)
#: Start options that are not flags (``--model`` gives the path).
NOT_FLAGS = ("model_path",)
#: Extra spellings: flag -> option.
ALIASES = {"--threads": "n_threads"}


@dataclasses.dataclass(frozen=True, slots=True)
class OptionSpec:
    """One start option as a flag: name, Python type, default, and owner group."""

    name: str
    type: Any
    default: Any
    group: str

    @property
    def flag(self) -> str:
        """``--n-ctx`` for ``n_ctx``."""
        return "--" + self.name.replace("_", "-")


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def option_specs() -> list[OptionSpec]:
    """A spec for each start option (except ``model_path``), grouped by owner."""
    wanted = [k for k in start_option_keys() if k not in NOT_FLAGS]
    specs: dict[str, OptionSpec] = {}
    for cls, group in OWNERS:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in wanted and f.name not in specs:
                specs[f.name] = OptionSpec(f.name, hints[f.name], _default(f), group)
    for name in wanted:  # an option no dataclass describes still gets a (string) flag
        specs.setdefault(name, OptionSpec(name, str, None, "other"))
    return sorted(specs.values(), key=lambda s: ([g for _, g in OWNERS] + ["other"]).index(
        s.group))


def _members(tp: Any) -> tuple[Any, ...]:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return tuple(a for a in typing.get_args(tp) if a is not type(None))
    return (tp,)


def _scalar(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "on", "yes"):
        return True
    if lowered in ("false", "off", "no"):
        return False
    return text


def _sequence(kind: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        if text.lstrip().startswith("["):
            return tuple(kind(v) for v in json.loads(text))
        return tuple(kind(v) for v in text.split(",") if v != "")

    return parse


def _json_mapping(text: str) -> dict[Any, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return {int(k) if k.lstrip("-").isdigit() else k: v for k, v in value.items()}


def _converter(tp: Any) -> tuple[Callable[[str], Any], str]:
    """``(parse, metavar)`` for a type."""
    members = _members(tp)
    origin = typing.get_origin(members[0])
    if len(members) > 1 and bool in members:
        return _scalar, "VALUE"
    if origin is tuple:
        item = typing.get_args(members[0])[0]
        return _sequence(item if item in (int, float) else str), "A,B,..."
    if origin is not None and issubclass(origin, Mapping):
        return _json_mapping, "JSON"
    if members[0] in (int, float):
        return members[0], members[0].__name__.upper()
    return str, "TEXT"


def add_option_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every start option, in one argument group per owner."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for spec in option_specs():
        group = groups.get(spec.group)
        if group is None:
            group = groups[spec.group] = parser.add_argument_group(spec.group)
        flags = [spec.flag, *[a for a, o in ALIASES.items() if o == spec.name]]
        default = "auto" if spec.default is None else repr(spec.default)
        if spec.type is bool:
            group.add_argument(*flags, dest=spec.name, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=f"(default: {default})")
            continue
        parse, metavar = _converter(spec.type)
        group.add_argument(*flags, dest=spec.name, type=parse, metavar=metavar,
                           default=argparse.SUPPRESS, help=f"(default: {default})")


def start_options(args: argparse.Namespace) -> dict[str, Any]:
    """The start options given on the command line."""
    keys = {spec.name for spec in option_specs()}
    return {k: v for k, v in vars(args).items() if k in keys}
