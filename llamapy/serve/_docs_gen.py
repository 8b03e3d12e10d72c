"""Writes the flag reference of the documentation (``docs/reference/flags.md``) from the CLI.

Run ``python -m llamapy.serve._docs_gen`` after adding, renaming or documenting a flag or an
option; a test fails while the checked-in page and this rendering disagree (``--check`` exits
1 then). The page walks :func:`llamapy.serve.cli.build_parser`, so it lists exactly the
flags ``python -m llamapy.serve`` takes: the serving groups, then one group per start-option
owner of the option tree (:data:`llamapy.options.START_OPTION_OWNERS`), where each flag also
names its ``Server`` keyword. Each row gives every spelling of the flag, the llama-server
environment variable that stands for it (:data:`llamapy.serve.flags.env.LLAMA_ENV`), its
default and its help text. Nothing in it depends on the machine it runs on.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ..options._typed_gen import write_or_check
from .cli import build_parser
from .flags.env import LLAMA_ENV
from .flags.start import option_specs

__all__ = ["main", "render", "target_path"]

#: A help text's trailing ``(default: X)``, moved to the default column.
_DEFAULT = re.compile(r"\s*\(default: ([^()]*(?:\([^()]*\)[^()]*)*)\)$")

_HEADER = """# Flag reference

Every flag of `python -m llamapy.serve`, grouped as `--help` groups them. Generated from the
command line parser and the option tree by `python -m llamapy.serve._docs_gen`; do not edit.

A flag of an option-tree group sets the `Server` keyword it names (`--n-ctx 4096` is
`Server(path, n_ctx=4096)`); a switch comes as a `--x` / `--no-x` pair. A llama-server
environment variable (`LLAMA_ARG_*`) is read as the flag it stands for; the command line wins.
See [migrating from llama-server](../llama-server.md) for what each llama-server spelling means
here.
"""


def target_path() -> Path:
    """Where the page lives: ``docs/reference/flags.md`` under the repository root."""
    return Path(__file__).resolve().parents[2] / "docs" / "reference" / "flags.md"


def _env_by_dest(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Each flag's destination -> the variables that stand for it."""
    out: dict[str, list[str]] = {}
    for variable, flag in sorted(LLAMA_ENV.items()):
        action = parser._option_string_actions.get(flag)
        if action is not None:
            out.setdefault(action.dest, []).append(variable)
    return out


def _cell(text: str) -> str:
    """Help text as one table cell: on one line, with Markdown's table, emphasis and HTML
    characters escaped."""
    text = " ".join(text.split())
    for char, escaped in (("|", "\\|"), ("*", "\\*"), ("<", "&lt;")):
        text = text.replace(char, escaped)
    return text


def _spellings(action: argparse.Action) -> str:
    metavar = action.metavar
    if metavar is None and action.choices is not None:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    elif metavar is None:
        metavar = action.dest.upper()
    if action.nargs == 0:
        metavar = None
    shown = [f"`{s} {metavar}`" if metavar else f"`{s}`" for s in action.option_strings]
    return ", ".join(shown).replace("|", "\\|")


def _default(action: argparse.Action, help_text: str) -> tuple[str, str]:
    """``(default, help without it)``: a trailing ``(default: X)``, else argparse's default."""
    found = _DEFAULT.search(help_text)
    if found:
        value, help_text = found.group(1), help_text[:found.start()]
    elif action.default in (None, argparse.SUPPRESS, [], ()) or action.nargs == 0:
        return "", help_text
    else:
        value = str(action.default)
    return f"`{value}`".replace("|", "\\|") if value != "" else '`""`', help_text


def _row(parser: argparse.ArgumentParser, action: argparse.Action,
         env: dict[str, list[str]], tree: set[str]) -> str:
    default, help_text = _default(action, " ".join(
        parser._get_formatter()._expand_help(action).split()))
    help_text = _cell(help_text)
    if action.dest in tree:
        help_text += f" (`Server` keyword `{action.dest}`)"
    variables = ", ".join(f"`{v}`" for v in env.get(action.dest, []))
    return f"| {_spellings(action)} | {variables} | {default} | {help_text} |"


def _title(text: str) -> str:
    """A group's title as a heading (capitalised, but llama-server keeps its lower case)."""
    return text if text.startswith("llama") else text[:1].upper() + text[1:]


def render() -> str:
    """The page as the parser and the option tree define it now."""
    parser = build_parser()
    env = _env_by_dest(parser)
    tree = {spec.name for spec in option_specs()}
    lines = [_HEADER]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS
                   and a.dest != "help"]
        if not actions:
            continue
        lines += [f"## {_title(group.title or '')}", "",
                  "| flags | environment | default | what it does |",
                  "| --- | --- | --- | --- |"]
        lines += [_row(parser, a, env, tree) for a in actions]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    """Rewrite the page (or check it with ``--check``: exit 1 if it is stale)."""
    write_or_check(target_path(), render(), sys.argv[1:])


if __name__ == "__main__":
    main()
