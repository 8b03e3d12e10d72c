"""llama-server's logging flags (:mod:`llamapy.serve.flags.log`): the verbosity threshold as
a level, the line format, colours."""

from __future__ import annotations

import logging
import re

import pytest

from llamapy.serve.cli import build_parser
from llamapy.serve.flags.env import env_argv
from llamapy.serve.flags.log import log_formatter, log_handlers


def _record(level: int) -> logging.LogRecord:
    return logging.LogRecord("llamapy.serve", level, __file__, 1, "serving %s", ("x",), None)


@pytest.mark.parametrize(("n", "level"), [("0", "error"), ("1", "error"), ("2", "warning"),
                                          ("3", "info"), ("4", "debug"), ("5", "debug")])
def test_the_verbosity_threshold_is_a_level(n: str, level: str) -> None:
    assert build_parser().parse_args(["-lv", n]).log_level == level
    assert build_parser().parse_args(["--log-verbosity", n]).log_level == level


def test_a_verbosity_that_is_no_number_is_refused() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--verbosity", "loud"])


@pytest.mark.parametrize(("argv", "line"), [
    ([], r"\d{4}-\d\d-\d\d [\d:,]+ INFO llamapy.serve: serving x"),
    (["--no-log-timestamps"], r"INFO llamapy.serve: serving x"),
    (["--no-log-prefix"], r"\d{4}-\d\d-\d\d [\d:,]+ serving x"),
    (["--no-log-prefix", "--no-log-timestamps"], r"serving x"),
])
def test_the_line_format(argv: list[str], line: str) -> None:
    formatted = log_formatter(build_parser().parse_args(argv)).format(_record(logging.INFO))
    assert re.fullmatch(line, formatted), formatted


def test_colours_by_level_only_when_asked() -> None:
    args = build_parser().parse_args(["--log-colors"])  # bare: on
    coloured = log_handlers(args)[0].format(_record(logging.ERROR))
    assert coloured.startswith("\x1b[31m") and coloured.endswith("\x1b[0m")
    assert "\x1b[" not in log_handlers(args)[0].format(_record(logging.INFO))
    plain = log_handlers(build_parser().parse_args(["--log-colors", "off"]))[0]
    assert "\x1b[" not in plain.format(_record(logging.ERROR))


def test_the_variables() -> None:
    parser = build_parser()
    env = env_argv(parser, [], {"LLAMA_ARG_LOG_VERBOSITY": "2", "LLAMA_ARG_LOG_PREFIX": "off",
                                "LLAMA_ARG_LOG_COLORS": "on"})
    args = parser.parse_args(env)
    assert (args.log_level, args.log_prefix, args.log_colors) == ("warning", False, "on")
    skipped = env_argv(parser, ["-v"], {"LLAMA_ARG_LOG_VERBOSITY": "1"})
    assert skipped == []  # the command line's -v sets the same option: it wins
