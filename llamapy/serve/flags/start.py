"""Command-line flags for every ``Server`` start option, generated from the option tree.

:func:`llamapy.options.start_option_keys` is the authority on which options exist; the
dataclasses that define them (:data:`llamapy.options.START_OPTION_OWNERS`: server sizing,
engine scheduling, sampling defaults, context tuning, model loading) give each one's type,
default and help text. ``n_ctx`` becomes ``--n-ctx`` (llama-server's spellings, ``-c``, are
declared on the field with ``flags=``; :data:`CLI_NAMES` renames a clash); a bool option
becomes a ``--name`` / ``--no-name`` pair (``--no-cache-prompt``, ``--no-kv-unified``), and one
whose name is a negation reads positively (``no_perf``: ``--perf`` / ``--no-perf``); tuples
take comma-separated values or a JSON list; mappings take JSON. Only flags given on the command
line are passed to ``Server``, so its own defaults apply otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...options import START_OPTION_OWNERS, field_default, field_help, start_option_keys
from .compat import compat_start_options

__all__ = ["SERVE_DEFAULTS", "OptionSpec", "add_option_flags", "option_specs",
           "serve_cache_ram_mb", "serve_start_options", "shown_default", "start_options",
           "unlimited_cache_ram_mb"]


def serve_cache_ram_mb() -> float:
    """The RAM prompt cache budget of ``python -m llamapy.serve``: a quarter of the memory
    available now, at most 8192 MB (llama-server's ``--cache-ram`` default). The cache only
    holds what it stores, so the budget is a ceiling, not an allocation."""
    available_mb = _meminfo_mb("MemAvailable")
    if available_mb is None:
        return 1024.0
    return float(min(8192, int(available_mb / 4)))


#: Start options whose default differs when serving over HTTP: ``(value, how it is shown)``.
#: The library ``Server`` keeps the tree's defaults (``prompt_cache_ram_mb`` 0: no RAM cache).
SERVE_DEFAULTS: dict[str, tuple[Callable[[], Any], str]] = {
    "prompt_cache_ram_mb": (serve_cache_ram_mb,
                            "a quarter of available memory, at most 8192; 0 = off, -1 = no limit"),
}


#: Start options whose generated flag would take a llama-server serving flag's name: the
#: context's ``embeddings`` (embeddings instead of logits) is ``--context-embeddings``, since
#: llama-server's ``--embeddings`` is accepted by the serving flags (and changes nothing).
CLI_NAMES: dict[str, str] = {"embeddings": "context_embeddings"}


@dataclasses.dataclass(frozen=True, slots=True)
class OptionSpec:
    """One start option as a flag: name, Python type, default, owner group, help, aliases."""

    name: str
    type: Any
    default: Any
    group: str
    help: str = ""
    aliases: tuple[str, ...] = ()

    @property
    def cli_name(self) -> str:
        """The name its flags are made from (:data:`CLI_NAMES`, else the option's)."""
        return CLI_NAMES.get(self.name, self.name)

    @property
    def flag(self) -> str:
        """``--n-ctx`` for ``n_ctx``."""
        return "--" + self.cli_name.replace("_", "-")

    @property
    def negated(self) -> bool:
        """A bool option named as a negation (``no_perf``): its flags read positively."""
        return self.type is bool and self.name.startswith("no_")

    @property
    def switches(self) -> tuple[str, str]:
        """``(on, off)`` flags of a bool option: ``--x, --no-x`` (``--perf, --no-perf``)."""
        base = self.cli_name[3:] if self.negated else self.cli_name
        on = "--" + base.replace("_", "-")
        return on, "--no-" + on[2:]


def option_specs() -> list[OptionSpec]:
    """A spec for each start option, grouped by owner (the first owner describes a name)."""
    wanted = set(start_option_keys())
    specs: dict[str, OptionSpec] = {}
    for cls, group in START_OPTION_OWNERS:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in wanted and f.name not in specs:
                specs[f.name] = OptionSpec(f.name, hints[f.name], field_default(f), group,
                                           field_help(f), tuple(f.metadata.get("flags", ())))
    missing = wanted - set(specs)
    if missing:  # every start option is a field of an owner; fail loudly if one is not
        raise AssertionError(f"start options without an owner: {sorted(missing)}")
    order = [g for _, g in START_OPTION_OWNERS]
    return sorted(specs.values(), key=lambda s: order.index(s.group))


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


def _int_or_word(text: str) -> int | str:
    """An integer, or the word as given (the option checks which words it takes)."""
    try:
        return int(text)
    except ValueError:
        return text


def _sequence(kind: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        if text.lstrip().startswith("["):
            return tuple(kind(v) for v in json.loads(text))
        return tuple(kind(v) for v in text.split(",") if v != "")

    return parse


_TOKEN_BIAS = re.compile(r"^\s*(\d+)\s*([+-])\s*(inf|\d+(?:\.\d*)?|\.\d+)\s*$", re.I)


def _json_mapping(text: str) -> dict[Any, Any]:
    """A JSON object, or llama-server's ``TOKEN_ID+BIAS`` / ``TOKEN_ID-BIAS`` (``-inf``
    bans the token)."""
    pair = _TOKEN_BIAS.match(text)
    if pair:
        token, sign, amount = pair.groups()
        return {int(token): float(sign + amount)}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError("expected a JSON object or TOKEN_ID(+|-)BIAS") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return {int(k) if k.lstrip("-").isdigit() else k: v for k, v in value.items()}


class _Merge(argparse.Action):
    """A mapping flag that may repeat: the entries of each use are merged."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, {**getattr(namespace, self.dest, {}), **values})


def _converter(tp: Any) -> tuple[Callable[[str], Any], str]:
    """``(parse, metavar)`` for a type."""
    members = _members(tp)
    origin = typing.get_origin(members[0])
    if len(members) > 1 and bool in members:
        return _scalar, "VALUE"
    if len(members) > 1 and int in members and str in members:
        return _int_or_word, "N"
    if origin is tuple:
        item = typing.get_args(members[0])[0]
        return _sequence(item if item in (int, float) else str), "A,B,..."
    if origin is not None and issubclass(origin, Mapping):
        return _json_mapping, "JSON"
    if members[0] in (int, float):
        return members[0], members[0].__name__.upper()
    return str, "TEXT"


def _plain(items: Sequence[Any]) -> bool:
    return all(str(v).isprintable() and "," not in str(v) and str(v) for v in items)


def shown_default(value: Any) -> str | None:
    """A default as a user would type it (None: the help text explains it)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, Mapping):
        return json.dumps({str(k): v for k, v in value.items()})
    if isinstance(value, tuple):
        if not value:
            return "none"
        return ",".join(map(str, value)) if _plain(value) else json.dumps(list(value))
    if isinstance(value, str):
        return value if value else '""'
    return f"{value:g}" if isinstance(value, float) else str(value)


def _help(spec: OptionSpec) -> str:
    """The help text with the default; a negated bool's text describes its ``--no-x`` flag."""
    text = f"{spec.switches[1]}: {spec.help}" if spec.negated else spec.help
    serve = SERVE_DEFAULTS.get(spec.name)
    shown = serve[1] if serve else shown_default(spec.default)
    text = text if shown is None else f"{text} (default: {shown})"
    return text.replace("%", "%%")


class _Switch(argparse.Action):
    """``--x`` / ``--no-x`` for a bool option; ``--x`` stores ``on`` (False for ``no_x``)."""

    def __init__(self, option_strings: Sequence[str], dest: str, on: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.on = on

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        positive = not (option_string or "").lstrip("-").startswith("no-")  # -no-kvu too
        setattr(namespace, self.dest, self.on if positive else not self.on)


def _add(group: argparse._ArgumentGroup, spec: OptionSpec) -> None:
    if spec.type is bool:
        on, off = spec.switches
        group.add_argument(on, off, *spec.aliases, dest=spec.name, action=_Switch,
                           on=not spec.negated, default=argparse.SUPPRESS, help=_help(spec))
        return
    parse, metavar = _converter(spec.type)
    action = _Merge if parse is _json_mapping else "store"
    group.add_argument(spec.flag, *spec.aliases, dest=spec.name, type=parse, metavar=metavar,
                       action=action, default=argparse.SUPPRESS, help=_help(spec))


def add_option_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every start option, in one argument group per owner."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for spec in option_specs():
        group = groups.get(spec.group)
        if group is None:
            group = groups[spec.group] = parser.add_argument_group(spec.group)
        _add(group, spec)


def start_options(args: argparse.Namespace) -> dict[str, Any]:
    """The start options given on the command line."""
    keys = {spec.name for spec in option_specs()}
    return {k: v for k, v in vars(args).items() if k in keys}


def _meminfo_mb(key: str) -> float | None:
    """A ``/proc/meminfo`` value in MB (None where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info[key].split()[0]) / 1024
    except (OSError, KeyError, ValueError):
        return None


def unlimited_cache_ram_mb() -> float:
    """llama-server's ``--cache-ram -1`` ("no limit"): the machine's whole memory, a budget
    the cache can never reach (it only holds what it stores)."""
    total = _meminfo_mb("MemTotal")
    return float(int(total)) if total else float(2**20)


def serve_start_options(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`start_options` plus the serving defaults (:data:`SERVE_DEFAULTS`) of the
    options not given; ``--cache-ram -1`` (llama-server's "no limit") becomes
    :func:`unlimited_cache_ram_mb` (other negative budgets are refused by the tree)."""
    options = start_options(args)
    options.update(compat_start_options(args, options))
    for name, (default, _) in SERVE_DEFAULTS.items():
        options.setdefault(name, default())
    if options["prompt_cache_ram_mb"] == -1:
        options["prompt_cache_ram_mb"] = unlimited_cache_ram_mb()
    return options
