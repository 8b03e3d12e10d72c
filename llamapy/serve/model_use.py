"""What a route needs of the model, declared where the route is (``@router.post(path,
model=ON_MODEL)``, or a router's default), and read by the middleware that holds the model
for a response (:class:`~llamapy.serve.multi.ModelSelect` with several models,
:class:`~llamapy.serve.sleep.WakeOnRequest` for one that sleeps) through a
:class:`RoutePolicy` of the app's routes.

- :data:`ON_MODEL`: the route runs on the model: the request leases it for its whole response
  (loading it on demand) and wakes it from sleep.
- :data:`READS_MODEL`: leased, not woken (``/props``: a sleeping model answers from its
  snapshot).
- :data:`NAMED_MODEL`: leased only when the request names a model, an admin's key only
  (``/metrics``); never woken.
- :data:`NO_MODEL`: no lease (listing, loading and unloading models, pages, stored
  responses): a request there never loads or wakes a model. A path no route serves is this too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from starlette.routing import compile_path

__all__ = ["NAMED_MODEL", "NO_MODEL", "ON_MODEL", "READS_MODEL", "ModelUse", "RoutePolicy"]


@dataclass(frozen=True, slots=True)
class ModelUse:
    """A route's need of the model: whether a request leases it (``always``, only when it
    ``named`` one, ``never``), whether it wakes a sleeping one, whether only an admin's key may
    (refused before anything loads)."""

    lease: Literal["always", "named", "never"] = "never"
    wakes: bool = False
    admin: bool = False


ON_MODEL = ModelUse("always", wakes=True)
READS_MODEL = ModelUse("always")
NAMED_MODEL = ModelUse("named", admin=True)
NO_MODEL = ModelUse()


class RoutePolicy:
    """The declared :class:`ModelUse` of every route of an app, by request path (``prefix``:
    the path the routes are mounted under)."""

    def __init__(self, uses: Iterable[tuple[str, ModelUse]], prefix: str = "") -> None:
        self.prefix = prefix
        self._exact: dict[str, ModelUse] = {}
        self._patterns: list[tuple[re.Pattern[str], ModelUse]] = []
        for path, use in uses:
            if "{" in path:
                self._patterns.append((compile_path(path)[0], use))
            else:
                self._exact[path] = use

    def use(self, path: str) -> ModelUse:
        """The use of the route serving ``path`` (a route without parameters before one with
        them; :data:`NO_MODEL` where no route does)."""
        if self.prefix:
            if not path.startswith(self.prefix + "/"):
                return NO_MODEL
            path = path[len(self.prefix):]
        found = self._exact.get(path)
        if found is not None:
            return found
        for pattern, use in self._patterns:
            if pattern.match(path):
                return use
        return NO_MODEL
