"""llama-server's logging flags, mapped onto Python's logging.

- ``-lv`` / ``--verbosity`` / ``--log-verbosity N``: llama.cpp's threshold (0 generic, 1
  error, 2 warning, 3 info, 4 trace, 5 debug) as a log level: 0-1 ``error``, 2 ``warning``,
  3 ``info``, 4 and above ``debug`` (``-v`` is ``debug`` too).
- ``--log-colors [on|off|auto]``: colour the lines by level on standard error (``auto``: when
  it is a terminal; a ``--log-file`` is never coloured).
- ``--log-timestamps`` / ``--no-log-timestamps``, ``--log-prefix`` / ``--no-log-prefix``: the
  time, and the level and logger name, in front of each message (both on by default here;
  llama-server's defaults differ, and its prefix is its own).
- ``--log-file FILE`` also writes the log there; ``--log-disable`` logs nothing.

``--log-level`` (and ``-v``) is in the serving group. Each option here but the verbosity
threshold (another spelling of ``log_level``) is a serving option of the option tree
(:class:`~llamapy.options.ServeOptions`), whose default and help its flag takes.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ...options.serve import LOG_COLORS
from .tree import serve_flag, serve_switch

__all__ = ["add_log_flags", "log_formatter", "log_handlers", "verbosity"]

#: ANSI colours by level (the others are left plain).
_COLOURS = {logging.DEBUG: "\x1b[90m", logging.WARNING: "\x1b[33m", logging.ERROR: "\x1b[31m",
            logging.CRITICAL: "\x1b[1;31m"}


def verbosity(value: str) -> str:
    """A llama.cpp verbosity threshold as a log level name."""
    n = int(value)
    return "error" if n <= 1 else "warning" if n == 2 else "info" if n == 3 else "debug"


def add_log_flags(group: argparse._ArgumentGroup) -> None:
    """Add the flags listed in the module docstring to ``group``."""
    group.add_argument("-lv", "--verbosity", "--log-verbosity", dest="log_level",
                       type=verbosity, metavar="N",
                       help="llama.cpp's verbosity threshold: 0-1 error, 2 warning, 3 info, "
                            "4+ debug")
    serve_flag(group, "log_colors", nargs="?", const="on", choices=LOG_COLORS)
    serve_switch(group, "log_timestamps", ("--no-log-timestamps",),
                 "no time before each message")
    serve_switch(group, "log_prefix", ("--no-log-prefix",),
                 "no level and logger name before each message")
    serve_flag(group, "log_file", metavar="FILE")
    serve_flag(group, "log_disable", action="store_true")


class _Coloured(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        colour = _COLOURS.get(record.levelno)
        return f"{colour}{line}\x1b[0m" if colour else line


def log_formatter(args: argparse.Namespace, coloured: bool = False) -> logging.Formatter:
    """The line format the flags ask for."""
    parts = ["%(asctime)s"] if args.log_timestamps is not False else []
    if args.log_prefix is not False:
        parts.append("%(levelname)s %(name)s:")
    fmt = " ".join([*parts, "%(message)s"])
    return _Coloured(fmt) if coloured else logging.Formatter(fmt)


def log_handlers(args: argparse.Namespace) -> list[logging.Handler]:
    """The log's handlers, formatted: none with ``--log-disable``, stderr, ``--log-file``'s."""
    if args.log_disable:
        return [logging.NullHandler()]
    stderr = logging.StreamHandler()
    colours = args.log_colors == "on" or (args.log_colors == "auto" and sys.stderr.isatty())
    stderr.setFormatter(log_formatter(args, coloured=colours))
    handlers: list[logging.Handler] = [stderr]
    if args.log_file:
        file = logging.FileHandler(args.log_file, encoding="utf-8")
        file.setFormatter(log_formatter(args))
        handlers.append(file)
    return handlers
