"""The model manager for a ``python -m llamapy.serve`` that serves several models.

:func:`build_manager` turns the several-models flags (:mod:`llamapy.serve.flags.models`) into
a :class:`~llamapy.server.ModelManager`: one spec per ``--model`` (named pairwise by
``--alias``), per ``*.gguf`` and per pulled model (:mod:`llamapy.hub.store`) of
``--models-dir`` and per ``[models.NAME]`` table of
``--models-preset``, under the ``--models-max`` / ``--models-memory-mb`` budget.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import InvalidOptionError, UnsupportedFeatureError
from ..server import ModelManager, ModelSpec
from ..server.model_spec import default_server_factory
from .flags.serving import read_template, sleep_idle_seconds

__all__ = ["SPEC_KEYS", "build_manager"]

#: Keys of a preset table that describe the model; any other key is a Server start option.
SPEC_KEYS = frozenset({"path", "aliases", "keep_alive", "pinned", "memory_mb", "chat_template"})


def build_manager(args: argparse.Namespace, options: Mapping[str, Any],
                  watch: Callable[[Any], Any] | None = None
                  ) -> tuple[ModelManager, dict[str, str]]:
    """The manager for the command line and the per-model chat template overrides.

    ``options``: the command line's start options (each model's defaults); ``watch`` is
    applied to each server the manager starts (``python -m llamapy.serve`` exits when one's
    thread dies). Raises
    :class:`InvalidOptionError` (or ``UnknownOptionError``) for bad input, ``OSError`` for an
    unreadable directory or preset.
    """
    specs: list[ModelSpec] = []
    templates: dict[str, str] = {}
    specs += _cli_specs(args, options)
    if args.models_dir:
        specs += _dir_specs(Path(args.models_dir), options)
    if args.models_preset:
        preset_specs, templates = _preset_specs(Path(args.models_preset), options)
        specs += preset_specs
    pinned = set(args.pin)
    unknown = pinned - {n for s in specs for n in s.names}
    if unknown:
        raise InvalidOptionError(f"--pin names no served model: {sorted(unknown)}",
                                 option="pin")
    specs = [_pinned(s) if pinned & set(s.names) else s for s in specs]
    sleep = sleep_idle_seconds(args)
    keep_alive = args.keep_alive if args.keep_alive is not None else (
        -1 if sleep is None else sleep)
    def factory(spec: ModelSpec) -> Any:
        server = default_server_factory(spec)
        return server if watch is None else watch(server)

    manager = ModelManager(specs, models_max=args.models_max,
                           memory_mb=args.models_memory_mb, keep_alive=keep_alive,
                           server_factory=factory)
    return manager, templates


def _pinned(spec: ModelSpec) -> ModelSpec:
    return ModelSpec(name=spec.name, path=spec.path, aliases=spec.aliases,
                     options=spec.options, keep_alive=spec.keep_alive, pinned=True,
                     memory_mb=spec.memory_mb)


def _cli_specs(args: argparse.Namespace, options: Mapping[str, Any]) -> list[ModelSpec]:
    paths = [Path(p) for p in args.model or []]
    names = list(args.alias or [])
    if names and len(paths) > 1 and len(names) != len(paths):
        raise InvalidOptionError(
            f"with several --model, give one --alias per model ({len(paths)} models, "
            f"{len(names)} aliases)", option="alias")
    if len(paths) == 1:  # one model: the first alias names it, the others are aliases too
        return [ModelSpec(name=names[0] if names else paths[0].stem, path=paths[0],
                          aliases=tuple(names[1:]), options=options)]
    if names and not paths:
        raise InvalidOptionError("--alias names --model files; there is none", option="alias")
    return [ModelSpec(name=names[i] if names else path.stem, path=path, options=options)
            for i, path in enumerate(paths)]


def _dir_specs(folder: Path, options: Mapping[str, Any]) -> list[ModelSpec]:
    if not folder.is_dir():
        raise InvalidOptionError(f"--models-dir {folder} is not a directory",
                                 option="models_dir")
    files = [ModelSpec(name=path.stem, path=path, options=options)
             for path in sorted(folder.glob("*.gguf"))]
    from ..hub.store import ModelStore  # models pulled into the folder by name

    pulled = [ModelSpec(name=entry.name, path=entry.path, options=options,
                        aliases=(*entry.aliases, *_untagged(entry.name)))
              for entry in ModelStore(folder).entries()]
    return files + pulled


def _untagged(name: str) -> tuple[str, ...]:
    """``hf.co/org/repo`` for a model pulled as ``hf.co/org/repo:latest`` (as Ollama names)."""
    return (name.removesuffix(":latest"),) if name.endswith(":latest") else ()


def _toml() -> Any:
    """``tomllib`` (Python 3.11+), else ``tomli`` where installed."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise UnsupportedFeatureError(
                "models_preset", "--models-preset needs Python 3.11+ or the tomli package"
            ) from None
    return tomllib


def _preset_specs(path: Path, options: Mapping[str, Any]
                  ) -> tuple[list[ModelSpec], dict[str, str]]:
    toml = _toml()
    try:
        tables = toml.loads(path.read_text(encoding="utf-8")).get("models", {})
    except toml.TOMLDecodeError as exc:
        raise InvalidOptionError(f"--models-preset {path}: {exc}", option="models_preset"
                                 ) from None
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise InvalidOptionError(f"--models-preset {path}: expected [models.NAME] tables",
                                 option="models_preset")
    specs, templates = [], {}
    for name, table in tables.items():
        if "path" not in table:
            raise InvalidOptionError(f"preset model {name!r} has no path", option="path")
        own = {k: v for k, v in table.items() if k not in SPEC_KEYS}
        specs.append(ModelSpec(
            name=name, path=(path.parent / str(table["path"])).expanduser(),
            aliases=tuple(table.get("aliases", ())), options={**options, **own},
            keep_alive=table.get("keep_alive"), pinned=bool(table.get("pinned", False)),
            memory_mb=table.get("memory_mb")))
        template = read_template(table.get("chat_template"))
        if template:
            templates[name] = template
    return specs, templates
