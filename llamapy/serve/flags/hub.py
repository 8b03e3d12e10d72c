"""The flags that name a model instead of giving its file: llama-server's ``-hf`` / ``-hfr`` /
``--hf-repo ORG/REPO[:QUANT]``, ``-hff`` / ``--hf-file FILE``, ``-hft`` / ``--hf-token TOKEN``
(default ``$HF_TOKEN``), ``--offline`` and ``--pull-on-demand`` (a Hub model a request names
as ``hf.co/ORG/REPO[:QUANT]`` is pulled into ``--models-dir`` and served:
:mod:`llamapy.hub.on_demand`; off by default) with its limits ``--pull-allow PATTERN``
(repeatable or comma-separated) and ``--pull-max-bytes N``.

They are generated from :class:`llamapy.options.hub.HubOptions` (one definition per option) and
checked there once (:func:`hub_options`). ``-hf`` downloads the model through huggingface_hub
(honouring ``HF_ENDPOINT`` for a mirror, its cache and progress bars) before it is served, as if
its path had been given with ``--model``. ``--offline`` means no network at all: a model in the
cache is served, a missing one is an :class:`~llamapy.errors.OfflineModelMissingError`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from ...errors import InvalidOptionError
from ...options import field_help
from ...options.hub import HubOptions

__all__ = ["add_hub_flags", "hub_model_path", "hub_options", "hub_puller"]


def add_hub_flags(group: argparse._ArgumentGroup) -> None:
    """Add a flag for each :class:`HubOptions` field to ``group``: a switch for a bool, a
    repeatable flag for a tuple, an ``int`` for an int, else a string."""
    for f in dataclasses.fields(HubOptions):
        names = ("--" + f.name.replace("_", "-"), *f.metadata.get("flags", ()))
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if kind == "bool":
            group.add_argument(*names, dest=f.name, action="store_true", help=field_help(f))
            continue
        extra: dict[str, Any] = {"action": "append"} if kind.startswith("tuple") else (
            {"type": int} if kind == "int" else {})
        # None: not given (the option's default; "" given is refused by hub_options)
        group.add_argument(*names, dest=f.name, default=None, metavar=f.name.upper(),
                           help=field_help(f), **extra)


def _items(values: list[str]) -> tuple[str, ...]:
    """A repeatable flag's values, each also comma-separated."""
    return tuple(item.strip() for value in values for item in value.split(",") if item.strip())


def hub_options(args: argparse.Namespace) -> HubOptions:
    """The parsed hub flags, checked (:class:`InvalidOptionError` for a bad value)."""
    values: dict[str, Any] = {f.name: getattr(args, f.name)
                              for f in dataclasses.fields(HubOptions)}
    for name, value in values.items():
        if value == "" or (isinstance(value, list) and not _items(value)):
            raise InvalidOptionError(f"--{name.replace('_', '-')}: empty value", option=name)
    given: dict[str, Any] = {k: _items(v) if isinstance(v, list) else v
                             for k, v in values.items() if v is not None}
    options = HubOptions(**given)
    if options.hf_repo and args.model:
        raise InvalidOptionError("give either --model or --hf-repo, not both", option="hf_repo")
    if options.pull_on_demand and not args.models_dir:
        raise InvalidOptionError("--pull-on-demand pulls into --models-dir: give one",
                                 option="pull_on_demand")
    if options.offline:
        os.environ["HF_HUB_OFFLINE"] = "1"  # huggingface_hub reads it when first imported
    return options


def hub_model_path(options: HubOptions) -> Path | None:
    """The file of ``--hf-repo``, downloaded and verified unless cached (None: no repo)."""
    ref = options.ref
    if ref is None:
        return None
    from ...hub.fetch import HubAccess, fetch_model

    access = HubAccess.from_env(token=options.hf_token, offline=options.offline)
    return fetch_model(ref, access, options.hf_file).path


def hub_puller(options: HubOptions, manager: Any, models_dir: str,
               start: dict[str, Any]) -> Any:
    """The ``puller`` of ``--pull-on-demand`` for ``manager`` (None when off)."""
    if not options.pull_on_demand:
        return None
    from ...hub.fetch import HubAccess
    from ...hub.on_demand import OnDemandPuller
    from ...hub.store import ModelStore

    return OnDemandPuller(manager, ModelStore(Path(models_dir)),
                          HubAccess.from_env(token=options.hf_token), start,
                          allow=options.pull_allow, max_bytes=options.pull_max_bytes)
