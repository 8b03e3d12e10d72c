"""Speculative decoding options: which drafters propose tokens, and how many.

``SpeculativeParams`` is the resolved form the engine uses. The server's defaults are flat
:class:`~llamapy.options.EngineConfig` fields named as llama-server's flags (``spec_type`` ->
``--spec-type``, ``spec_draft_n_max`` -> ``--spec-draft-n-max``, ...); a request overrides them
with its ``speculative`` option: a drafter name (``"ngram"``), ``False``/``"off"``, or a mapping
of :class:`SpeculativeParams` fields (``{"type": "ngram", "n_max": 8}``), the fields it does not
name keeping the server's values.

Drafters (``type``, comma-separated, tried in order until one proposes):

- ``ngram``: prompt lookup over the request's own tokens, then a pool learned from finished
  requests of the same ``cache_scope`` and model (llama-server's ``ngram-simple``,
  ``ngram-mod``, ``ngram-map-k``, ``ngram-map-k4v`` and ``ngram-cache`` map here);
- ``draft``: a smaller draft model with the same vocabulary (``--spec-draft-model``;
  llama-server's ``draft-simple``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, cast

from llamapy.errors import UnknownOptionError
from llamapy.options._spec import check, check_typed_fields, is_int, option

__all__ = ["SPEC_TYPE_ALIASES", "SpeculativeParams", "parse_spec_type", "speculative_overrides"]

#: llama-server's ``--spec-type`` values (and ours) -> our drafter names.
SPEC_TYPE_ALIASES: Mapping[str, str] = {
    "off": "", "none": "", "": "",
    "ngram": "ngram", "ngram-simple": "ngram", "ngram-mod": "ngram", "ngram-map-k": "ngram",
    "ngram-map-k4v": "ngram", "ngram-cache": "ngram", "prompt-lookup": "ngram",
    "draft": "draft", "draft-simple": "draft",
}


def parse_spec_type(value: object) -> tuple[str, ...]:
    """``value`` (a comma-separated string or a sequence of names) as drafter names in order,
    duplicates and ``off`` dropped; ``InvalidOptionError`` for an unknown name."""
    if isinstance(value, str):
        names = [v.strip().lower() for v in value.split(",")]
    else:
        check(isinstance(value, tuple | list), "speculative.type",
              "must be a drafter name or a list of them")
        names = [str(v).strip().lower() for v in cast("Sequence[object]", value)]
    out: list[str] = []
    for name in names:
        kind = SPEC_TYPE_ALIASES.get(name)
        valid = ", ".join(sorted(filter(None, SPEC_TYPE_ALIASES)))
        check(kind is not None, "speculative.type", f"unknown drafter {name!r}; valid: {valid}")
        if kind and kind not in out:
            out.append(kind)
    return tuple(out)


@dataclass(slots=True, frozen=True, kw_only=True)
class SpeculativeParams:
    """Resolved speculative decoding settings of one request.

    ``type``: drafter names in the order they are tried (``()`` = off). ``n_max``: most draft
    tokens verified per step; ``n_min``: a shorter draft is not worth verifying. ``p_min``: the
    draft model stops drafting at a token its own top probability is below. ``ngram_size``:
    the longest n-gram the lookup matches (it falls back down to 2 tokens). ``adaptive``: draft
    length follows the measured acceptance and speculation turns itself off for a request whose
    acceptance stays below break-even. ``max_streams``: a tick with more requests decoding
    than this drafts nothing (0: no limit); on a CPU the batch's extra tokens cost about what a
    stream's own do once several streams share each decode, so drafts pay only while few do
    (measured in the project's benchmarks: 1 stream gains, 4 and 16 lose).
    """

    type: tuple[str, ...] = option((), "drafters tried in order: ngram, draft (() = off)")
    n_max: int = option(16, "most draft tokens per verification step")
    n_min: int = option(0, "fewest draft tokens worth verifying")
    p_min: float = option(0.0, "draft model: stop at a token less likely than this")
    ngram_size: int = option(4, "longest n-gram the lookup matches")
    adaptive: bool = option(True, "draft length follows acceptance; off below break-even")
    max_streams: int = option(1, "speculate only while at most this many requests decode "
                                 "(0 = any number)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", parse_spec_type(self.type))
        check_typed_fields(self)
        check(is_int(self.n_max) and 0 <= self.n_max <= 256, "speculative.n_max",
              "must be an integer in [0, 256]")
        check(is_int(self.n_min) and self.n_min >= 0, "speculative.n_min",
              "must be an integer >= 0")
        check(0.0 <= self.p_min <= 1.0, "speculative.p_min", "must be within [0, 1]")
        check(is_int(self.ngram_size) and 2 <= self.ngram_size <= 64, "speculative.ngram_size",
              "must be an integer in [2, 64]")
        check(isinstance(self.adaptive, bool), "speculative.adaptive", "must be a bool")
        check(is_int(self.max_streams) and self.max_streams >= 0, "speculative.max_streams",
              "must be an integer >= 0 (0 = any number)")

    @property
    def enabled(self) -> bool:
        """Whether any drafter is on and a draft may have a token."""
        return bool(self.type) and self.n_max > 0

    def merged(self, overrides: Mapping[str, Any] | None) -> SpeculativeParams:
        """These settings with a request's ``overrides`` applied."""
        return self if not overrides else replace(self, **overrides)


_FIELDS = frozenset(f.name for f in fields(SpeculativeParams))


def speculative_overrides(value: object) -> Mapping[str, Any] | None:
    """A request's ``speculative`` option as validated field overrides (None = the server's).

    A string names the drafters, a bool turns the server's drafters off (``False``) or asks for
    ``ngram`` (``True``), a mapping overrides fields (llama-server's ``speculative.n_max``-style
    keys are accepted without the prefix by the HTTP layer)."""
    if value is None:
        return None
    if isinstance(value, bool):
        value = {"type": "ngram" if value else "off"}
    elif isinstance(value, str | tuple | list):
        value = {"type": value}
    check(isinstance(value, Mapping), "speculative",
          "must be a drafter name, a bool or a mapping of speculative settings")
    assert isinstance(value, Mapping)
    check(all(isinstance(k, str) for k in value), "speculative", "setting names are strings")
    unknown = set(value) - _FIELDS
    if unknown:
        raise UnknownOptionError(unknown, sorted(_FIELDS), where="speculative")
    resolved = SpeculativeParams(**value)  # validates every value
    return {k: getattr(resolved, k) for k in value}
