"""Writes :mod:`llamapy.options.typed` (the keyword ``TypedDict`` of a generation call) from the
option tree.

Run ``python -m llamapy.options._typed_gen`` after adding, renaming or retyping an option; a
test fails while the checked-in module and the tree disagree. Each key's type is the type a
caller may pass (:func:`~llamapy.options._spec.field_input_type`: the field's ``accepts``, else
its annotation); an alias of :data:`~llamapy.options.ALIASES` gets its target's type.
:func:`typed_dict_source` renders any such table (the session's ``DecodeFields`` too).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

from llamapy.options._spec import field_help, field_input_type
from llamapy.options.aliases import ALIASES
from llamapy.options.sampling import RequestOptions, SamplingParams
from llamapy.options.start import CallOptions

__all__ = ["TypedKey", "generation_option_keys", "render", "typed_dict_source"]

#: Where each name a key's type may use is imported from.
_IMPORTS = {"Any": "typing", "Hashable": "collections.abc", "Mapping": "collections.abc",
            "Sequence": "collections.abc", "Literal": "typing",
            "StructuredOutput": "llamapy.session.config"}
_NAME = re.compile(r"\b[A-Z]\w*")


@dataclasses.dataclass(frozen=True, slots=True)
class TypedKey:
    """One key of a generated ``TypedDict``: its type (source text) and a comment."""

    type: str
    help: str


def generation_option_keys() -> dict[str, TypedKey]:
    """Every keyword of a generation call with its type: the request options, the sampling
    options and the call options in tree order, then the aliases."""
    out: dict[str, TypedKey] = {}
    owners = ((RequestOptions, ("sampling",)), (SamplingParams, ()), (CallOptions, ()))
    for cls, exclude in owners:
        for f in dataclasses.fields(cls):
            if f.name not in exclude:
                out[f.name] = TypedKey(field_input_type(f), field_help(f))
    for alias, target in ALIASES.items():
        out[alias] = TypedKey(out[target].type, f"alias of ``{target}``")
    return out


def _imports(types: list[str]) -> list[str]:
    names = sorted({n for t in types for n in _NAME.findall(t)} - {"None"})
    unknown = [n for n in names if n not in _IMPORTS]
    if unknown:
        raise ValueError(f"no import known for {unknown} (add it to _IMPORTS)")
    by_module: dict[str, list[str]] = {}
    for name in names:
        by_module.setdefault(_IMPORTS[name], []).append(name)
    by_module.setdefault("typing", []).append("TypedDict")
    order = sorted(by_module, key=lambda m: (m.startswith("llamapy"), m))
    lines = [f"from {m} import {', '.join(sorted(by_module[m]))}" for m in order]
    first_local = next((i for i, m in enumerate(order) if m.startswith("llamapy")), None)
    if first_local is not None:
        lines.insert(first_local, "")
    return lines


def typed_dict_source(module_doc: str, name: str, class_doc: str,
                      keys: Mapping[str, TypedKey]) -> str:
    """The source of a module that defines ``class name(TypedDict, total=False)`` with
    ``keys`` (each preceded by its help as a ``#:`` comment)."""
    body: list[str] = []
    for key, typed in keys.items():
        body += textwrap.wrap(typed.help, 94, initial_indent="    #: ",
                              subsequent_indent="    #: ")
        body.append(f"    {key}: {typed.type}")
    doc = textwrap.indent(class_doc.strip(), "    ").lstrip()
    return "\n".join([
        f'"""{module_doc.strip()}\n"""', "", "from __future__ import annotations", "",
        *_imports([t.type for t in keys.values()]), "", f'__all__ = ["{name}"]', "", "",
        f"class {name}(TypedDict, total=False):", f'    """{doc}\n    """', "", *body, "",
    ])


_MODULE_DOC = """
The keyword options of a generation call, typed: :class:`GenerationOptions`.

Generated from the option tree by ``python -m llamapy.options._typed_gen``; do not edit. A
function taking ``**options: Unpack[GenerationOptions]`` (``Unpack`` from ``typing`` on Python
3.11+, from ``typing_extensions`` before) lets editors complete the option names and a type
checker refuse an unknown name or a value of the wrong type.
"""

_CLASS_DOC = """
Every keyword ``Server.generate``/``complete``/``stream`` (and their token and async forms)
take: the request options (:class:`~llamapy.options.RequestOptions`), the sampling options
(:class:`~llamapy.options.SamplingParams`), the call options
(:class:`~llamapy.options.CallOptions`) and the other spellings of
:data:`~llamapy.options.ALIASES` (``temperature`` for ``temp``). All are optional.
"""


def render() -> str:
    """The source of :mod:`llamapy.options.typed` as the option tree defines it now."""
    return typed_dict_source(_MODULE_DOC, "GenerationOptions", _CLASS_DOC,
                             generation_option_keys())


def write_or_check(target: Path, text: str, argv: Sequence[str]) -> None:
    """Write a generated file, or with ``--check`` in ``argv`` exit 1 when ``target`` differs
    from ``text`` (the generators' one command line)."""
    if "--check" in argv:
        stale = not target.exists() or target.read_text(encoding="utf-8") != text
        sys.exit(1 if stale else 0)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")


def main() -> None:
    """Rewrite ``llamapy/options/typed.py`` (or check it with ``--check``: exit 1 if stale)."""
    write_or_check(Path(__file__).with_name("typed.py"), render(), sys.argv[1:])


if __name__ == "__main__":
    main()
