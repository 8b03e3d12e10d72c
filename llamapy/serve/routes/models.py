"""llama-server router mode's model endpoints: ``POST /models/load`` and ``POST /models/unload``
(body ``{"model": NAME}``, answer ``{"success": true}``), present when the app serves several
models. An unknown model is a 404 listing the served ones; a failed load answers with the
model's typed error. When keys carry tenants, only admin keys may load and unload (it changes
what every tenant is served): a tenant key gets a 403.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from ...errors import InvalidRequestError
from ..context import AppContext, read_json
from ..multi import ModelRouter
from ..routing import Router


def _model_name(body: Any) -> str:
    name = body.get("model") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("the body must be {\"model\": NAME}")
    return name


def models_router(ctx: AppContext, models: ModelRouter) -> Router:
    """``/models/load`` and ``/models/unload`` (behind the API key)."""
    router = Router(checks=[ctx.check_key])
    manager = models.manager

    @router.post("/models/load")
    async def load(request: Request) -> dict[str, Any]:
        """Load a model now and wait for it (bounded by the request timeout; admin keys
        only when keys carry tenants)."""
        ctx.check_admin(request, "/models/load")
        name = _model_name(await read_json(request))
        status = await run_in_threadpool(manager.load, name, models.request_timeout)
        return {"success": True, "model": status.name, "status": {"value": status.state.value}}

    @router.post("/models/unload")
    async def unload(request: Request) -> dict[str, Any]:
        """Unload a model (one in use: once its requests end; admin keys only when keys
        carry tenants)."""
        ctx.check_admin(request, "/models/unload")
        name = _model_name(await read_json(request))
        status = await run_in_threadpool(manager.unload, name)
        return {"success": True, "model": status.name, "status": {"value": status.state.value}}

    return router
