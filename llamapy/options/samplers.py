"""The order of the sampler chain (llama-server's ``samplers`` / ``--samplers`` /
``--sampler-seq``): names, their aliases and one-letter codes.

The canonical names are llama.cpp's: ``penalties``, ``dry``, ``top_n_sigma``, ``top_k``,
``typ_p``, ``top_p``, ``min_p``, ``xtc``, ``temperature``. A name may also be written in
kebab case (``top-k``), without underscores (``topk``), in any case, or as ``nucleus``
(``top_p``), ``temp`` (``temperature``), ``typ`` or ``typical_p`` (``typ_p``). A string is
llama-server's sequence of one-letter codes (``"edskypmxt"``, its default order).
"""

from __future__ import annotations

from collections.abc import Iterable

from llamapy.errors import InvalidOptionError

__all__ = ["DEFAULT_SAMPLERS", "SAMPLER_CODES", "sampler_names"]

#: llama-server's default order.
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p",
                    "xtc", "temperature")
#: ``--sampler-seq`` letters.
SAMPLER_CODES = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p",
                 "p": "top_p", "m": "min_p", "x": "xtc", "t": "temperature"}
#: llama.cpp's samplers that this chain does not build.
_UNSUPPORTED = {"infill", "adaptive_p", "adaptivep", "adaptive-p", "i", "a"}


def _aliases() -> dict[str, str]:
    names: dict[str, str] = {}
    for name in DEFAULT_SAMPLERS:
        names[name] = names[name.replace("_", "-")] = names[name.replace("_", "")] = name
    names.update(nucleus="top_p", temp="temperature", typ="typ_p", typical_p="typ_p")
    return names


_NAMES = _aliases()


def sampler_names(value: str | Iterable[str]) -> tuple[str, ...]:
    """Canonical names, in order, of a string of codes or of names (``;``-separated lists,
    as ``--samplers`` takes them, are split). Raises :class:`InvalidOptionError` naming what
    is unknown."""
    if isinstance(value, str):
        return tuple(_one(SAMPLER_CODES, code, "code") for code in value)
    try:
        items = [part.strip() for item in value for part in str(item).split(";")]
    except TypeError:
        raise InvalidOptionError("samplers must be a list of names or a string of codes",
                                 option="samplers") from None
    return tuple(_one(_NAMES, item.lower(), "name") for item in items if item)


def _one(table: dict[str, str], key: str, kind: str) -> str:
    if key in table:
        return table[key]
    known = ", ".join(DEFAULT_SAMPLERS) if kind == "name" else "".join(SAMPLER_CODES)
    why = "is not built here" if key in _UNSUPPORTED else "is unknown"
    raise InvalidOptionError(f"sampler {kind} {key!r} {why} (known: {known})",
                             option="samplers")
