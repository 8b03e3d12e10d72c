"""How a serving option of the option tree (:class:`~llamapy.options.ServeOptions`) becomes a
flag of ``python -m llamapy.serve``: its destination is the option's name, its default and
help are the tree's, its spellings ``--<name>`` and the tree's others (``flags=``) unless the
flag names its own. Every flag of a serving option is made here, whatever its group.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from ...options.serve import ServeOptions, serve_default, serve_help

__all__ = ["serve_flag", "serve_switch", "switch"]


def switch(group: argparse._ArgumentGroup, names: Sequence[str], dest: str, on: bool,
           help: str) -> None:
    """A flag that stores ``on`` in ``dest``."""
    group.add_argument(*names, dest=dest, action="store_const", const=on, help=help)


def serve_flag(group: argparse._ArgumentGroup, name: str, *names: str, more: str = "",
               **kw: Any) -> None:
    """The flag of serving option ``name``: its default and help from the option tree (the
    help followed by ``more``, what only the flag does, and by its default unless the help
    says it or there is none); spelled ``names``, else ``--<name>`` and the tree's other
    spellings."""
    spellings = names or ("--" + name.replace("_", "-"), *tree_flags(name))
    default = serve_default(name)
    text = serve_help(name) + more
    if kw.get("action") != "store_true" and "default:" not in text and default not in (None, ()):
        text += " (default: %(default)s)"
    group.add_argument(*spellings, dest=name, default=default, help=text, **kw)


def serve_switch(group: argparse._ArgumentGroup, name: str, off: Sequence[str],
                 off_help: str) -> None:
    """A switch pair for the boolean serving option ``name``: ``--<name>`` (and the tree's
    other spellings) turns it on, ``off`` turns it off; its default is the tree's."""
    on = ("--" + name.replace("_", "-"), *tree_flags(name))
    default = serve_default(name)
    switch(group, on, name, True, serve_help(name) + (" (default)" if default else ""))
    switch(group, off, name, False, off_help + ("" if default else " (default)"))
    group.set_defaults(**{name: default})


def tree_flags(name: str) -> tuple[str, ...]:
    """The other spellings the option tree gives serving option ``name`` (``-to``, ``--ui``)."""
    field = next(f for f in dataclasses.fields(ServeOptions) if f.name == name)
    return tuple(field.metadata.get("flags", ()))
