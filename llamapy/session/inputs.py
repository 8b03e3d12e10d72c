"""What the session primitives accept: their input dataclasses, or plain Python values.

``ensure_prefix`` / ``prefill_suffix`` take a :class:`PrefixInput` / :class:`SuffixInput`, a
``str`` (text) or a sequence of token ids; ``decode`` takes a :class:`DecodeConfig`, keyword
arguments of one, or both (the keywords override the config's fields). Anything else is a
``TypeError`` naming what is accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llamapy.session.config import DecodeConfig, PrefixInput, SuffixInput
from llamapy.session.manifest import ContextManifest, declared_identity, segments_for

if TYPE_CHECKING:
    from llamapy.session.host import SessionHost

__all__ = ["as_decode_config", "as_prefix", "as_suffix", "tokenize_prefix"]


def _token_ids(value: object) -> tuple[int, ...] | None:
    """``value`` as token ids, if it is a (non-string) sequence of ints."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        return None
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return None
    return tuple(value)


def _refuse(what: str, expected: str, value: object) -> TypeError:
    return TypeError(f"{what} takes {expected}, a str or a sequence of token ids; "
                     f"got {type(value).__name__}")


def as_prefix(value: PrefixInput | str | Sequence[int]) -> PrefixInput:
    """The :class:`PrefixInput` for ``ensure_prefix``'s argument."""
    if isinstance(value, PrefixInput):
        return value
    if isinstance(value, str):
        return PrefixInput(text=value)
    ids = _token_ids(value)
    if ids is None:
        raise _refuse("ensure_prefix", "a PrefixInput", value)
    return PrefixInput(token_ids=ids)


def as_suffix(value: SuffixInput | str | Sequence[int]) -> SuffixInput:
    """The :class:`SuffixInput` for ``prefill_suffix``'s argument."""
    if isinstance(value, SuffixInput):
        return value
    if isinstance(value, str):
        return SuffixInput(text=value)
    ids = _token_ids(value)
    if ids is None:
        raise _refuse("prefill_suffix", "a SuffixInput", value)
    return SuffixInput(token_ids=ids)


def as_decode_config(config: DecodeConfig | None, overrides: Mapping[str, Any]) -> DecodeConfig:
    """``config`` (default: ``DecodeConfig()``) with keyword ``overrides`` applied; unknown
    keywords are a ``TypeError`` naming the fields."""
    if config is not None and not isinstance(config, DecodeConfig):
        raise TypeError(f"decode takes a DecodeConfig and/or its fields as keywords; got "
                        f"{type(config).__name__}")
    base = config or DecodeConfig()
    if not overrides:
        return base
    names = {f.name for f in dataclasses.fields(DecodeConfig)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise TypeError(f"decode got unknown keyword(s) {unknown}; DecodeConfig fields are "
                        f"{sorted(names)}")
    return dataclasses.replace(base, **overrides)


def tokenize_prefix(host: SessionHost, prefix: PrefixInput) -> tuple[list[int], ContextManifest]:
    """The prefix's tokens (segments tokenized one by one, BOS only before the first) and
    its manifest: the host's identity with the caller's declared fields, and the segments."""
    add_bos = host.add_bos if prefix.add_bos is None else prefix.add_bos
    if prefix.token_ids is not None:
        parts = [("tokens", "", list(prefix.token_ids))]
    else:
        pieces = [(s.kind, s.text) for s in prefix.segments] or [("text", prefix.text or "")]
        parts = [(kind, text, host.tokenize(text, add_bos and i == 0))
                 for i, (kind, text) in enumerate(pieces)]
    bos_policy = None if prefix.add_bos is None else ("bos" if add_bos else "no_bos")
    manifest = declared_identity(host.base_manifest, prefix.manifest, bos_policy)
    return [t for *_, ids in parts for t in ids], manifest.replace(segments=segments_for(parts))
