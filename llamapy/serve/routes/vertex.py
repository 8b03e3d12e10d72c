"""Vertex AI's prediction protocol for custom containers, as llama-server serves it.

With ``AIP_MODE=PREDICTION`` in the environment, ``POST AIP_PREDICT_ROUTE`` (default
``/predict``) takes ``{"instances": [...]}`` (at most :data:`MAX_INSTANCES`): each instance is
one request to another route, named by its ``@requestFormat`` (a route's camelCase name, such
as ``chatCompletions`` for ``/v1/chat/completions``, or its path), with the rest of the
instance as its body. Instances run concurrently, never streamed; the answer is
``{"predictions": [...]}``, one response body per instance, in order (an instance's error is
its error body). ``AIP_HTTP_PORT`` replaces ``--port``; ``AIP_HEALTH_ROUTE`` also serves
``/health`` there. Each instance goes through the app again, with the predict request's
headers, so keys, host checks and limits apply to it as to any request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Mount, Route

from ...errors import InvalidOptionError
from ..flags.vertex_env import VertexSettings, vertex_settings

__all__ = ["MAX_INSTANCES", "VertexSettings", "install_vertex", "request_format",
           "vertex_settings"]

#: Most instances one predict request may carry (llama-server's bound).
MAX_INSTANCES = 128
#: Headers not forwarded to an instance's request (they describe the predict body).
_DROPPED_HEADERS = frozenset({"content-length", "content-type", "transfer-encoding"})


def request_format(path: str) -> str:
    """The camelCase ``@requestFormat`` name of a route path (``/v1/chat/completions`` ->
    ``chatCompletions``, ``/apply-template`` -> ``applyTemplate``)."""
    text = path.removeprefix("/v1").lstrip("/").split(":", 1)[0].split("{", 1)[0]
    out, cap = [], False
    for char in text:
        if char in "/-_":
            cap = True
        else:
            out.append(char.upper() if cap else char)
            cap = False
    return "".join(out)


def _post_paths(routes: list[BaseRoute], prefix: str = "") -> Iterator[str]:
    for route in routes:
        if isinstance(route, Mount):
            yield from _post_paths(list(route.routes), prefix + route.path)
        elif isinstance(route, Route) and "POST" in (route.methods or ()):
            yield prefix + route.path


def _error(message: str, status: int = 400) -> dict[str, Any]:
    kind = "invalid_request_error" if status == 400 else "server_error"
    return {"error": {"code": status, "message": message, "type": kind}}


def install_vertex(app: Starlette, settings: VertexSettings) -> None:
    """Add the predict route (and the health alias) to ``app``."""
    paths = list(_post_paths(app.router.routes))
    if settings.predict_path in paths:
        raise InvalidOptionError(f"AIP_PREDICT_ROUTE={settings.predict_path} is one of the "
                                 "server's routes", option="AIP_PREDICT_ROUTE")
    formats: dict[str, str] = {}
    for path in paths:
        formats.setdefault(request_format(path), path)
    formats.update({path: path for path in paths})
    routes: list[BaseRoute] = [Route(settings.predict_path, _predictor(app, formats),
                                     methods=["POST"])]
    if settings.health_path:
        health = next(r for r in app.router.routes if isinstance(r, Route) and r.path == "/health")
        routes.append(Route(settings.health_path, health.endpoint, methods=["GET"]))
    app.router.routes[:0] = routes


def _predictor(app: Starlette, formats: Mapping[str, str]) -> Any:
    async def predict(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return JSONResponse(_error(f"request body is not JSON: {exc}"), status_code=400)
        instances = body.get("instances") if isinstance(body, dict) else None
        if not isinstance(instances, list):
            return JSONResponse(_error("request body must include an array field named "
                                       "instances"), status_code=400)
        if len(instances) > MAX_INSTANCES:
            return JSONResponse(_error(f"instances array exceeds maximum size of "
                                       f"{MAX_INSTANCES}"), status_code=400)
        headers = {k: v for k, v in request.headers.items() if k not in _DROPPED_HEADERS}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=str(request.base_url),
                                     headers=headers, timeout=None) as client:
            predictions = await asyncio.gather(
                *(_one(client, formats, instance) for instance in instances))
        return JSONResponse({"predictions": predictions})

    return predict


async def _one(client: httpx.AsyncClient, formats: Mapping[str, str], instance: object) -> Any:
    """One instance's response body."""
    if not isinstance(instance, dict):
        return _error("each instance must be a JSON object")
    name = instance.get("@requestFormat")
    if not isinstance(name, str):
        return _error("each instance must include a string @requestFormat")
    path = formats.get(name)
    if path is None:
        return _error(f"no handler registered for @requestFormat: {name}")
    payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
    if "stream" in payload:
        payload["stream"] = False
    response = await client.post(path, json=payload)
    try:
        return response.json()
    except ValueError:
        return response.text
