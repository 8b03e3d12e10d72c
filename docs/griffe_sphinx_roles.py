"""A griffe extension for the API reference: Sphinx roles in docstrings become code spans.

The package's docstrings cross-reference with Sphinx roles (``:class:`~llamapy.Server```,
``:meth:`close```), which Markdown would show as raw text. Each becomes an inline code span of
the name a reader would see (the last dotted part after ``~``, the title of ``title <target>``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const|term|ref):`([^`]+)`")


def _shown(target: str) -> str:
    titled = re.fullmatch(r"(.*?)\s*<(.+)>", target)
    if titled:
        return titled.group(1)
    if target.startswith("~"):
        return target[1:].rsplit(".", 1)[-1]
    return target


def plain_roles(text: str) -> str:
    """``text`` with each Sphinx role replaced by a code span of the name it shows."""
    return _ROLE.sub(lambda m: f"`{_shown(m.group(1))}`", text)


class SphinxRoles(griffe.Extension):
    """Rewrites every loaded object's docstring with :func:`plain_roles`."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
