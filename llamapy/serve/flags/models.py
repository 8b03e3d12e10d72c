"""The flags that serve several models from one ``python -m llamapy.serve``.

Several models are served when ``--model`` is given more than once, or with ``--models-dir``
(every ``*.gguf`` in it, named by its stem, and every model pulled into it by
``python -m llamapy pull``, by its name and aliases) or ``--models-preset`` (a TOML file).
With several ``--model``, ``--alias`` names them pairwise (the i-th alias names the i-th
model; default: the file's stem). Every model gets the command line's start options; a
preset's table overrides them per model::

    [models.smol]
    path = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    aliases = ["small"]
    keep_alive = "5m"      # Ollama durations; 0 = unload after the request, -1 = keep
    pinned = true
    memory_mb = 200        # charged against --models-memory-mb (default: the file size)
    chat_template = "chatml"   # a built-in name, a file or Jinja source
    n_ctx = 4096           # any other key is a Server start option (unknown keys raise)
    n_parallel = 2

``--models-max`` and ``--models-memory-mb`` are the budget, ``--keep-alive`` the default idle
TTL, ``--pin NAME`` pins a model (see :class:`~llamapy.server.ModelManager`); any of them with
a single ``--model`` serves it through the manager too (``--keep-alive 5m``: unload it when
idle, reload on the next request). The manager itself is built by
:func:`llamapy.serve.models_specs.build_manager`.
"""

from __future__ import annotations

import argparse

__all__ = ["add_models_flags", "serves_several"]


def add_models_flags(group: argparse._ArgumentGroup) -> None:
    """Add the several-models flags to ``group``."""
    group.add_argument("--models-dir", metavar="DIR",
                       help="serve every *.gguf in DIR (named by the file's stem) and every "
                            "model pulled into DIR (python -m llamapy pull), on demand")
    group.add_argument("--models-preset", metavar="TOML",
                       help="serve the models of a TOML preset ([models.NAME] tables: path, "
                            "aliases, keep_alive, pinned, memory_mb, chat_template, start "
                            "options)")
    group.add_argument("--models-max", type=int, default=0, metavar="N",
                       help="most models loaded at once; loading another unloads the least "
                            "recently used idle one (default: 0 = no limit)")
    group.add_argument("--models-memory-mb", type=float, default=0.0, metavar="MB",
                       help="most estimated memory of the loaded models (default: 0 = no "
                            "limit)")
    group.add_argument("--keep-alive", default=None, metavar="DURATION",
                       help="how long an idle model stays loaded: seconds or 30s/5m/1h; 0 = "
                            "unload after each request; -1 = keep (default: -1)")
    group.add_argument("--pin", action="append", default=[], metavar="NAME",
                       help="never unload this model for room or idleness (repeatable)")


def serves_several(args: argparse.Namespace) -> bool:
    """Whether the command line asks for a ModelManager: several models, or one with a budget
    or idle rule (``--models-max``, ``--models-memory-mb``, ``--keep-alive``, ``--pin``)."""
    return (len(args.model or []) > 1 or bool(args.models_dir or args.models_preset)
            or bool(args.models_max or args.models_memory_mb or args.pin)
            or args.keep_alive is not None)
