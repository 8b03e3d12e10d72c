"""The keyword fields of ``Session.decode``, typed: :class:`DecodeFields`.

Generated from :class:`~llamapy.session.config.DecodeConfig` by ``python -m
llamapy.session._fields_gen``; do not edit. Annotate ``**fields: Unpack[DecodeFields]``.
"""

from __future__ import annotations

from typing import Any, TypedDict

from llamapy.session.config import StructuredOutput

__all__ = ["DecodeFields"]


class DecodeFields(TypedDict, total=False):
    """The fields of :class:`~llamapy.session.config.DecodeConfig`, each optional, as keywords of
    ``Session.decode`` / ``adecode``.
    """

    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    parser_protocols: tuple[str, ...]
    reasoning_format: str
    structured_output: StructuredOutput
    speculative: Any
