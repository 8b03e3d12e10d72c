"""Shared by the schema_to_gbnf tests: a schema's rules by name, and which texts its grammar
accepts (:mod:`gbnf_match`, a GBNF matcher in Python)."""

from __future__ import annotations

import re
from typing import Any

from gbnf_match import Grammar

from llamapy.grammar import schema_to_gbnf


def rules(schema: Any) -> dict[str, str]:
    text = schema_to_gbnf(schema)
    assert text.startswith("root ::= ")
    out = {}
    for line in text.splitlines():
        name, _, body = line.partition(" ::= ")
        assert re.fullmatch(r"[a-zA-Z0-9-]+", name), name
        out[name] = body
    return out


def accepts(schema: Any, *texts: str) -> list[bool]:
    grammar = Grammar.parse(schema_to_gbnf(schema))
    return [grammar.matches(text) for text in texts]
