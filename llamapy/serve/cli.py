"""The command line of ``python -m llamapy.serve``: its parser and the model it names.

A library module, so the Ray builder, the flag reference and tests read the same parser as the
entry point without importing it."""

from __future__ import annotations

import argparse
from pathlib import Path

from .flags.compat import add_compat_flags
from .flags.hub import add_hub_flags
from .flags.log import add_log_flags
from .flags.models import add_models_flags
from .flags.serving import add_serving_flags
from .flags.start import add_option_flags

__all__ = ["build_parser", "model_path"]


def build_parser() -> argparse.ArgumentParser:
    """The CLI parser: serving flags, then one group per start-option owner."""
    parser = argparse.ArgumentParser(
        prog="python -m llamapy.serve",
        description="Serve a GGUF model with an OpenAI-compatible API (plus llama-server's "
                    "native endpoints, /metrics and a chat page at /). llama-server's flag "
                    "spellings are accepted (-m, -c, -np, -ngl, -fa, --alias, ...).",
        # no abbreviations: llama-server's ``--keep 64`` must not become ``--keep-alive 64``
        allow_abbrev=False)
    add_serving_flags(parser.add_argument_group("serving"))
    add_models_flags(parser.add_argument_group("several models"))
    add_hub_flags(parser.add_argument_group("models by name (Hugging Face Hub)"))
    add_compat_flags(parser.add_argument_group("llama-server compatibility"))
    add_log_flags(parser.add_argument_group("logging"))
    add_option_flags(parser)
    return parser


def model_path(value: str | None) -> Path:
    """``--model``, or the default model (fetched when missing)."""
    if value:
        return Path(value)
    from ..models import default_model_path

    return default_model_path(fetch=True)
