"""Writes :mod:`llamapy.session.fields` (``DecodeFields``, the keywords of ``Session.decode``)
from :class:`~llamapy.session.config.DecodeConfig`'s fields.

Run ``python -m llamapy.session._fields_gen`` after changing ``DecodeConfig``; a test fails while
the checked-in module and the dataclass disagree.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from llamapy.options._spec import field_input_type
from llamapy.options._typed_gen import TypedKey, typed_dict_source, write_or_check
from llamapy.session.config import DecodeConfig

__all__ = ["decode_field_keys", "render"]

_MODULE_DOC = """
The keyword fields of ``Session.decode``, typed: :class:`DecodeFields`.

Generated from :class:`~llamapy.session.config.DecodeConfig` by ``python -m
llamapy.session._fields_gen``; do not edit. Annotate ``**fields: Unpack[DecodeFields]``.
"""

_CLASS_DOC = """
The fields of :class:`~llamapy.session.config.DecodeConfig`, each optional, as keywords of
``Session.decode`` / ``adecode``.
"""


def decode_field_keys() -> dict[str, TypedKey]:
    """Every ``DecodeConfig`` field with the type a caller may pass."""
    return {f.name: TypedKey(field_input_type(f), str(f.metadata.get("help", "")))
            for f in dataclasses.fields(DecodeConfig)}


def render() -> str:
    """The source of :mod:`llamapy.session.fields` as ``DecodeConfig`` defines it now."""
    return typed_dict_source(_MODULE_DOC, "DecodeFields", _CLASS_DOC, decode_field_keys())


def main() -> None:
    """Rewrite ``llamapy/session/fields.py`` (``--check``: exit 1 if it is stale)."""
    write_or_check(Path(__file__).with_name("fields.py"), render(), sys.argv[1:])


if __name__ == "__main__":
    main()
