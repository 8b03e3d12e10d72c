"""``python -m llamapy "prompt"``: stream a completion from the default model to stdout.

``python -m llamapy pull|list|rm|show ...`` manages the local model store instead
(:mod:`llamapy.hub.cli`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .errors import LlamapyError

if TYPE_CHECKING:
    from .server import Server


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m llamapy", description=__doc__)
    parser.add_argument("prompt", help="the prompt (sent through the model's chat template "
                        "unless --raw)")
    parser.add_argument("--model", help="GGUF path or a pulled model's name (default: "
                        "SmolLM2-135M-Instruct, fetched into the cache if missing)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temp", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=-1)
    parser.add_argument("--raw", action="store_true", help="no chat template")
    parser.add_argument("--verbose", action="store_true", help="show llama.cpp logs")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Generate from a prompt with the continuous-batching server, streaming to stdout (or run
    a store command: see the module)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from .hub.cli import COMMANDS

    if argv and argv[0] in COMMANDS:
        from .hub.cli import main as store_main

        return store_main(argv)
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.ERROR)
    from .models import default_model_path
    from .server import Server

    try:
        path = _model_path(args.model) if args.model else default_model_path(fetch=True)
        with Server(path, n_ctx=4096, n_parallel=1) as server:
            tokens = _prompt_tokens(server.wait_ready(), args.prompt, args.raw)
            for chunk in server.stream_tokens(tokens, max_tokens=args.max_tokens, temp=args.temp,
                                              seed=args.seed):
                print(chunk, end="", flush=True)
            print()
    except LlamapyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _prompt_tokens(server: Server, prompt: str, raw: bool) -> Sequence[int]:
    """``prompt`` as a user message through the chat template the HTTP server renders (the
    GGUF's Jinja template, BOS added once), or as raw text."""
    from .openai_api import ServedModel

    served = ServedModel(server)
    if raw:
        return server.tokenize(prompt)
    rendered = served.chat_templates().apply({"messages": [{"role": "user", "content": prompt}]})
    return served.tokenize_prompt(rendered.prompt)


def _model_path(value: str) -> str:
    """A GGUF path, or the path of a model pulled into the store under that name."""
    if os.path.exists(value):
        return value
    from .hub.store import ModelStore

    return str(ModelStore().find(value).path)


if __name__ == "__main__":
    sys.exit(main())
