"""Routes on Starlette: handlers of the request, checks run before them, JSON for plain results.

Every handler reads its own JSON and validates it in the API modules, so the app needs routing,
not a framework: importing FastAPI (its OpenAPI models, its dependency solver) cost about
0.2 s at every start, a third of the time to a healthy ``/health``. :class:`Router` keeps what
we used of it: ``get`` / ``post`` / ``websocket`` decorators (stackable, one handler under
several paths), checks that guard every route of a router (the API key), an optional error
shape of its own (Anthropic's), what each route needs of the model
(:mod:`llamapy.serve.model_use`) and a ``dict`` or ``list`` result sent as JSON.
:func:`openapi_document` builds ``/openapi.json`` from the routes on first request,
request-body schemas included.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Route, WebSocketRoute, get_route_path
from starlette.websockets import WebSocket

from ..errors import InvalidOptionError
from .model_use import NO_MODEL, ModelUse

Handler = Callable[[Request], Awaitable[Any]]
#: A WebSocket route's handler: it answers the handshake (accepts or denies) and the frames.
SocketHandler = Callable[[WebSocket], Awaitable[None]]
#: A check before a route's handler: it raises to refuse the request (its result is ignored).
Check = Callable[[Request], object]
ErrorShape = Callable[[Request, Exception], Response]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A documented route: its path, method, summary and request-body schema (a callable, so
    the pydantic schema is built only when ``/openapi.json`` is asked for)."""

    path: str
    method: str
    summary: str
    schema: Callable[[], dict[str, Any]] | None = None


class Router:
    """The routes of one API; ``checks`` run before every handler (an exception ends the
    request); ``error_shape`` turns any exception of the route into its response (otherwise
    exceptions go to the app's handlers); ``model`` is what its routes need of the model
    unless a route says otherwise (:mod:`llamapy.serve.model_use`)."""

    def __init__(self, *, checks: Sequence[Check] = (), error_shape: ErrorShape | None = None,
                 model: ModelUse = NO_MODEL) -> None:
        self.checks = tuple(checks)
        self.error_shape = error_shape
        self.model = model
        self.routes: list[BaseRoute] = []
        self.endpoints: list[Endpoint] = []
        #: Each HTTP route's path and what it needs of the model.
        self.uses: list[tuple[str, ModelUse]] = []

    def get(self, path: str, *, schema: Callable[[], dict[str, Any]] | None = None,
            hidden: bool = False, model: ModelUse | None = None
            ) -> Callable[[Handler], Handler]:
        """Register the decorated handler for ``GET path`` (``hidden``: not documented;
        ``model``: its need of the model, else the router's)."""
        return self._route("GET", path, schema, hidden, model)

    def post(self, path: str, *, schema: Callable[[], dict[str, Any]] | None = None,
             hidden: bool = False, model: ModelUse | None = None
             ) -> Callable[[Handler], Handler]:
        """Register the decorated handler for ``POST path``; ``schema`` gives its body's JSON
        schema for the document."""
        return self._route("POST", path, schema, hidden, model)

    def delete(self, path: str, *, hidden: bool = False, model: ModelUse | None = None
               ) -> Callable[[Handler], Handler]:
        """Register the decorated handler for ``DELETE path``."""
        return self._route("DELETE", path, None, hidden, model)

    def websocket(self, path: str) -> Callable[[SocketHandler], SocketHandler]:
        """Register the decorated handler for WebSocket connections to ``path`` (not
        documented; ``checks`` and ``error_shape`` do not apply: the handler checks its
        handshake itself)."""
        def register(handler: SocketHandler) -> SocketHandler:
            self.routes.append(WebSocketRoute(path, handler, name=f"{handler.__name__} {path}"))
            return handler

        return register

    def _route(self, method: str, path: str, schema: Callable[[], dict[str, Any]] | None,
               hidden: bool, model: ModelUse | None) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.routes.append(Route(path, self._endpoint(handler), methods=[method],
                                     name=f"{handler.__name__} {path}"))
            self.uses.append((path, self.model if model is None else model))
            if not hidden:
                summary = (handler.__doc__ or "").strip().split("\n\n")[0]
                self.endpoints.append(Endpoint(path, method.lower(), " ".join(summary.split()),
                                               schema))
            return handler

        return register

    def _endpoint(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        checks, error_shape = self.checks, self.error_shape

        async def endpoint(request: Request) -> Response:
            try:
                for check in checks:
                    check(request)
                result = await handler(request)
            except Exception as exc:
                if error_shape is None:
                    raise
                return error_shape(request, exc)
            return result if isinstance(result, Response) else JSONResponse(result)

        return endpoint


def route_error_shape(routers: Iterable[Router], default: ErrorShape, prefix: str = ""
                      ) -> ErrorShape:
    """The error shape of the route a request is for (its router's, else ``default``), for a
    middleware that answers before routing; ``prefix``: the path the routes are mounted under."""
    shaped = [(route, router.error_shape) for router in routers
              if router.error_shape is not None for route in router.routes]

    def shape(request: Request, exc: Exception) -> Response:
        path = get_route_path(request.scope)
        if prefix and path.startswith(prefix + "/"):
            path = path[len(prefix):]
        scope = {"type": "http", "path": path, "method": request.method}
        for route, error_shape in shaped:
            if route.matches(scope)[0] is not Match.NONE:
                return error_shape(request, exc)
        return default(request, exc)

    return shape


def path_int(request: Request, name: str) -> int:
    """The path parameter ``name`` as an int (else :class:`InvalidOptionError`, a 400)."""
    value = request.path_params[name]
    try:
        return int(value)
    except ValueError:
        raise InvalidOptionError(f"{name}: {value!r} is not an integer", option=name) from None


def query_required(request: Request, name: str) -> str:
    """The query parameter ``name`` (else :class:`InvalidOptionError`, a 400)."""
    value = request.query_params.get(name)
    if value is None:
        raise InvalidOptionError(f"the query parameter {name!r} is required", option=name)
    return value


def openapi_document(endpoints: Iterable[Endpoint], *, title: str, version: str,
                     summary: str) -> dict[str, Any]:
    """An OpenAPI 3.1 document of ``endpoints``."""
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        operation: dict[str, Any] = {"summary": endpoint.summary,
                                     "responses": {"200": {"description": "OK"}}}
        if endpoint.schema is not None:
            operation["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": endpoint.schema()}}}
        paths.setdefault(endpoint.path.replace(":path}", "}"), {})[endpoint.method] = operation
    return {"openapi": "3.1.0", "info": {"title": title, "version": version, "summary": summary},
            "paths": paths}
