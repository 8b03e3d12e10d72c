"""Grammars for constrained generation: JSON Schema to GBNF, and forced tool calls.

- :func:`schema_to_gbnf` converts a JSON schema (``response_format: json_schema``).
- :func:`json_object_grammar` is any JSON object (``response_format: json_object``).
- :func:`tool_call_grammar` forces a valid call of one of the request's tools (Hermes'
  framing; the lazy grammar of tools offered comes from llama.cpp's chat layer).

Unsupported schema keywords raise :class:`~llamapy.errors.UnsupportedFeatureError` naming the
keyword; unsatisfiable or malformed schemas raise :class:`~llamapy.errors.GrammarError`.
"""

from llamapy.grammar.gbnf import GrammarBuilder
from llamapy.grammar.json_schema import SchemaConverter, json_object_grammar, schema_to_gbnf
from llamapy.grammar.primitives import STRING_FORMATS
from llamapy.grammar.tool_calls import (
    chosen_function,
    tool_call_grammar,
)

__all__ = [
    "STRING_FORMATS",
    "GrammarBuilder",
    "SchemaConverter",
    "chosen_function",
    "json_object_grammar",
    "schema_to_gbnf",
    "tool_call_grammar",
]
