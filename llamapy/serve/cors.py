"""CORS as llama-server does it: every ``OPTIONS`` request is a preflight answered ``200`` (never
a 405, and before the API key check: browsers send no key on a preflight), and a response names
the request's ``Origin`` in ``Access-Control-Allow-Origin`` only when that origin is allowed;
a foreign origin gets the same ``200`` without the header (the browser then refuses it).

Allowed origins (``--cors-origins``, each value may be a comma-separated list): exact origins,
``*`` (any origin, echoed back with credentials, as llama-server's default does) and
``localhost`` (any ``http(s)://localhost``, ``127.0.0.1`` or ``[::1]`` origin on any port,
llama-server's special value). With none given, :data:`DEFAULT_ORIGINS` applies: ``localhost``
(llama-server's default is ``*``; see the README's deliberate differences).

CORS only decides which pages may read answers; the same policy also decides which foreign
pages may send requests that change state (:mod:`llamapy.serve.guard` refuses the others).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["DEFAULT_ORIGINS", "LOCALHOST_ORIGIN", "CorsMiddleware", "CorsPolicy"]

#: Origins allowed when ``--cors-origins`` is not given.
DEFAULT_ORIGINS = ("localhost",)
#: Origins the ``localhost`` value allows (llama-server's ``origin_is_localhost``).
LOCALHOST_ORIGIN = re.compile(r"https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]+)?")
#: ``Access-Control-Allow-Methods`` of a preflight (llama-server's ``--cors-methods``).
METHODS = "GET, POST, DELETE, OPTIONS"


class CorsPolicy:
    """Which origins may read responses (see the module)."""

    def __init__(self, origins: Iterable[str] = DEFAULT_ORIGINS) -> None:
        names = {name.strip() for value in origins for name in value.split(",")}
        names.discard("")
        self.any = "*" in names
        self.localhost = "localhost" in names
        self.exact = frozenset(names - {"*", "localhost"})

    def allows(self, origin: str) -> bool:
        """Whether ``origin`` (an ``Origin`` header value) may read responses."""
        return bool(origin) and (self.any or origin in self.exact or (
            self.localhost and LOCALHOST_ORIGIN.fullmatch(origin) is not None))


class CorsMiddleware:
    """ASGI middleware: preflights answered here, allowed origins named on every response;
    ``expose`` lists response headers a page may read."""

    def __init__(self, app: ASGIApp, policy: CorsPolicy, expose: Sequence[str] = ()) -> None:
        self.app = app
        self.policy = policy
        self.expose = ", ".join(expose)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin", "")
        allowed = self.policy.allows(origin)
        if scope["method"] == "OPTIONS":
            await self._preflight(headers, origin if allowed else None)(scope, receive, send)
            return
        if not allowed:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                out["Access-Control-Allow-Origin"] = origin
                out["Access-Control-Allow-Credentials"] = "true"
                if self.expose:
                    out["Access-Control-Expose-Headers"] = self.expose
                out.add_vary_header("Origin")
            await send(message)

        await self.app(scope, receive, send_with_cors)

    def _preflight(self, headers: Headers, origin: str | None) -> Response:
        """The ``200`` answer to a preflight (the requested headers are allowed by name:
        browsers never match ``Authorization`` against ``*``)."""
        out = {"Access-Control-Allow-Credentials": "true", "Access-Control-Allow-Methods": METHODS,
               "Access-Control-Allow-Headers": headers.get("access-control-request-headers", "*"),
               "Vary": "Origin"}
        if origin is not None:
            out["Access-Control-Allow-Origin"] = origin
        return Response(b"", status_code=200, headers=out, media_type="text/html")
