"""``create_app``: the Starlette application serving one :class:`~llamapy.server.Server`, or several
models through a :class:`~llamapy.server.ModelManager`."""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from .._paths import cache_dir
from ..anthropic_api import MessagesBody
from ..errors import InvalidOptionError, LlamapyError
from ..ollama_api import ChatBody as OllamaChatBody
from ..ollama_api import EmbedBody as OllamaEmbedBody
from ..ollama_api import GenerateBody as OllamaGenerateBody
from ..openai_api import ChatBody, CompletionBody, ServedModel
from ..openai_api.response_store import ResponseStore
from ..openai_api.responses_params import ResponsesBody
from ..options.serve import ServeOptions
from ..server import ModelManager, Server
from .context import CACHE_HEADERS, AppContext
from .cors import DEFAULT_ORIGINS, CorsMiddleware, CorsPolicy
from .errors import BodyLimit, CatchAll, error_response, install_error_handlers
from .flags.serving import url_prefix
from .guard import BrowserGuard, HostPolicy
from .host import Loader, ModelHost
from .metrics.registry import RequestCounter
from .model_use import RoutePolicy
from .multi import ModelRouter
from .pages.live_view import events_router
from .routes.anthropic import anthropic_router
from .routes.llama import health_router, llama_router
from .routes.models import models_router
from .routes.ollama import ollama_router
from .routes.openai import openai_router
from .routes.rerank import rerank_router
from .routes.responses import responses_router
from .routes.responses_compact import compact_router
from .routes.responses_ws import responses_ws_router
from .routes.stored import stored_router
from .routing import Endpoint, ErrorShape, Router, openapi_document, route_error_shape
from .slot_store import SlotBudget, SlotStore
from .source import ModelSource
from .tenants import KeyTable

STATIC_DIR = Path(__file__).with_name("pages") / "static"
#: Request bodies whose pydantic validators are built after start (``defer_build``).
BODY_MODELS = (ChatBody, CompletionBody, ResponsesBody, MessagesBody, OllamaChatBody,
               OllamaGenerateBody, OllamaEmbedBody)


#: The serving options' defaults (the option tree's).
_SERVE = ServeOptions()


def create_app(target: Server | Loader | ModelManager, *, alias: str | None = _SERVE.alias,
               api_key: str | None = _SERVE.api_key, api_keys: KeyTable | None = None,
               cors_origins: Sequence[str] = _SERVE.cors_origins,
               allowed_hosts: Sequence[str] = _SERVE.allowed_hosts,
               bind_hosts: Sequence[str] = (), chat_template: str | None = None,
               request_timeout: float = _SERVE.request_timeout,
               max_body_bytes: int = _SERVE.max_body_bytes,
               embeddings: bool = _SERVE.embeddings, webui: bool = _SERVE.webui,
               slots: bool = _SERVE.slots, metrics: bool = _SERVE.metrics,
               props: bool = _SERVE.props, slot_save_path: str | None = _SERVE.slot_save_path,
               own_server: bool = False, chat_templates: Mapping[str, str] | None = None,
               api_prefix: str = _SERVE.api_prefix,
               sse_ping_interval: float = _SERVE.sse_ping_interval, **served: Any) -> Starlette:
    """The app for ``target``: OpenAI, Responses, Anthropic, Ollama and llama-server routes.

    ``target``: a :class:`Server`, a callable returning one (run on a thread; ``/health`` is 503
    meanwhile) or a :class:`~llamapy.server.ModelManager` (the request's ``model`` picks one,
    see :mod:`llamapy.serve.multi`, with ``/models/load|unload``; ``chat_templates`` per model).
    ``api_key`` (keys, comma-separated) or ``api_keys`` (keys with tenants,
    :mod:`llamapy.serve.tenants`; not both) protect all but ``/health`` and the pages.
    ``cors_origins``, ``allowed_hosts`` and ``bind_hosts``: which pages and ``Host`` names are
    answered (:mod:`llamapy.serve.cors`, :mod:`llamapy.serve.guard`). ``chat_template``: Jinja
    overriding the GGUF's. ``slot_save_path`` and the ``slot_save_*`` budgets (in ``served``):
    the slot files' folder (:mod:`llamapy.serve.slot_store`); ``responses_*``: the stored
    responses. ``own_server``: close it on shutdown. The serving options (the keywords
    :class:`~llamapy.options.ServeOptions` names; in ``served`` the presentation ones such as
    ``aliases``, ``n_predict``, ``cache_report``) mean, default to and are checked as it says."""
    _check_serving(alias, api_key, cors_origins, allowed_hosts, max_body_bytes,
                   sse_ping_interval, served.get("sleep_idle_seconds"))
    store, responses = _slot_store(slot_save_path, served), _response_store(served)  # (popped)
    owned = _owner(target, alias=alias, chat_template=chat_template,
                   chat_templates=chat_templates, request_timeout=request_timeout, **served)
    ctx = _context(owned, keys=_key_table(api_key, api_keys), embeddings=embeddings, slots=slots,
                   metrics_endpoint=metrics, props_endpoint=props, slot_store=store,
                   response_store=responses, sse_ping_interval=sse_ping_interval)
    app = _assemble(ctx, owned if own_server else None, webui, url_prefix(api_prefix),
                    max_body_bytes)
    _add_middleware(app, ctx, CorsPolicy(cors_origins or DEFAULT_ORIGINS), max_body_bytes,
                    HostPolicy(allowed_hosts, bind_hosts), app.state.error_shape)
    return app


def _check_serving(alias: str | None, api_key: str | None, cors_origins: Sequence[str],
                   allowed_hosts: Sequence[str], max_body_bytes: int,
                   sse_ping_interval: float, sleep_idle_seconds: float | None) -> None:
    """Check ``create_app``'s serving keywords through the option tree (raises if one is
    bad)."""
    ServeOptions(alias=alias, api_key=api_key, cors_origins=tuple(cors_origins or ()),
                 allowed_hosts=tuple(allowed_hosts or ()), max_body_bytes=max_body_bytes,
                 sse_ping_interval=sse_ping_interval, sleep_idle_seconds=sleep_idle_seconds)


def _assemble(ctx: AppContext, owned: ModelSource | None, webui: bool,
              prefix: str, max_body_bytes: int) -> Starlette:
    """The app's routes (under ``prefix``; WebSocket frames up to ``max_body_bytes``),
    lifespan (closing ``owned``), state and error handlers."""
    routers = _routers(ctx, webui, max_body_bytes)
    routes = _routes(routers, webui)
    app = Starlette(routes=[Mount(prefix, routes=routes)] if prefix else routes,
                    lifespan=_lifespan(ctx, owned))
    app.state.llamapy = ctx
    app.state.error_shape = route_error_shape(routers, _openai_shape, prefix)
    app.state.route_policy = RoutePolicy(
        (use for router in routers for use in router.uses), prefix)
    install_error_handlers(app)
    return app


#: The slot files' budgets, keywords of ``create_app`` (ServeOptions defines them).
_SLOT_BUDGETS = ("slot_save_max_mb", "slot_save_max_files", "slot_save_tenant_max_mb",
                 "slot_save_tenant_max_files")


def _slot_store(folder: str | None, served: dict[str, Any]) -> SlotStore | None:
    """The slot files of ``folder`` within the ``slot_save_*`` budgets, taken out of
    ``served`` (checked by ServeOptions; None without a folder: the slot actions answer
    501)."""
    budgets = ServeOptions(**{k: served.pop(k) for k in _SLOT_BUDGETS if k in served})
    return None if folder is None else SlotStore(folder, SlotBudget.of(budgets))


def _response_store(served: dict[str, Any]) -> ResponseStore | None:
    """The stored responses of the ``responses_*`` options, taken out of ``served`` (None:
    ``'off'``)."""
    options = ServeOptions(**{k: served.pop(k) for k in _RESPONSES if k in served})
    where = options.responses_store
    if where == "off":
        return None
    path = str(cache_dir() / "responses.sqlite3") if where == "auto" else where
    return ResponseStore(path, ttl_s=options.responses_ttl,
                         max_bytes=int(options.responses_max_mb * 1024 * 1024),
                         tenant_max_bytes=int(options.responses_tenant_max_mb * 1024 * 1024))


#: The stored responses' options, keywords of ``create_app`` (ServeOptions defines them).
_RESPONSES = ("responses_store", "responses_ttl", "responses_max_mb", "responses_tenant_max_mb")


def _key_table(api_key: str | None, api_keys: KeyTable | None) -> KeyTable | None:
    """The app's keys: ``api_keys``, or ``api_key``'s plain keys (one tenant, all admins)."""
    if api_key is not None and api_keys is not None:
        raise InvalidOptionError("give api_key or api_keys, not both", option="api_key")
    return api_keys if api_key is None else KeyTable.of_keys(api_key)


def _context(owned: ModelSource, **options: Any) -> AppContext:
    """The app's context on its models' source; before the model sleeps, the embedder is
    freed."""
    ctx = AppContext(owned, **options)
    owned.on_sleep(lambda served: ctx.close())
    return ctx


def _routers(ctx: AppContext, webui: bool, max_body_bytes: int) -> list[Router]:
    """Every API's router (the models router for several models), ``/openapi.json``'s, the
    pages'; WebSocket frames up to ``max_body_bytes``."""
    routers = [make(ctx) for make in (health_router, openai_router, responses_router,
                                      compact_router, stored_router, anthropic_router,
                                      ollama_router, llama_router, rerank_router,
                                      events_router)]
    routers.append(responses_ws_router(ctx, max_body_bytes))
    if isinstance(ctx.source, ModelRouter):  # router mode's /models/load and /models/unload
        routers.append(models_router(ctx, ctx.source))
    if webui:
        routers.append(_page_router())
    routers.append(_openapi_router([e for r in routers for e in r.endpoints]))
    return routers


def _routes(routers: list[Router], webui: bool) -> list[Any]:
    """The routers' routes, and the pages' static files."""
    routes: list[Any] = [route for router in routers for route in router.routes]
    if webui:
        routes.append(Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"))
    return routes


def _openai_shape(request: Request, exc: Exception) -> JSONResponse:
    """The error shape of the routes without one of their own (OpenAI's, llama-server's)."""
    return error_response(exc)


def _openapi_router(endpoints: list[Endpoint]) -> Router:
    router = Router()
    document: dict[str, Any] = {}

    @router.get("/openapi.json", hidden=True)
    async def openapi(request: Request) -> JSONResponse:
        """The OpenAPI document of the routes (built on first request)."""
        if not document:
            from .. import __version__

            document.update(openapi_document(endpoints, title="llamapy", version=__version__,
                                             summary="OpenAI-compatible llama.cpp server"))
        return JSONResponse(document)

    return router


def _owner(target: Server | Loader | ModelManager, *, alias: str | None,
           chat_template: str | None, chat_templates: Mapping[str, str] | None,
           request_timeout: float, sleep_idle_seconds: float | None = None, **served: Any
           ) -> ModelSource:
    """What serves the app's models: a :class:`ModelHost` for one, a :class:`ModelRouter`
    for a manager's several."""
    if isinstance(target, ModelManager):
        return ModelRouter(target, chat_templates=chat_templates, chat_template=chat_template,
                           request_timeout=request_timeout, **served)
    return ModelHost(target, name=alias or "", chat_template=chat_template,
                     request_timeout=request_timeout, sleep_idle_seconds=sleep_idle_seconds,
                     **served)


#: How long the body validators wait for the model before they are built regardless (s).
BODY_BUILD_WAIT = 30.0


def build_body_models() -> None:
    """Build the request bodies' validators (their classes defer it: a start does not wait for
    ~0.1 s of schema building; a request that comes first builds its own)."""
    for model in BODY_MODELS:
        model.model_rebuild()


def warm_up(source: ModelSource) -> None:
    """The app lifespan's thread: once the model starting with the app has loaded (doing it
    sooner would hold the GIL that the load's native log callbacks wait for), build the body
    validators and do the first request's other one-time work (:func:`warm_first_request`)."""
    served = source.wait_started(BODY_BUILD_WAIT)
    build_body_models()
    if served is not None:
        warm_first_request(served)


def warm_first_request(served: ServedModel) -> None:
    """One-time work the first request would otherwise pay (~0.1 s on a small CPU): anyio's
    asyncio backend, loaded by the first streamed response, numpy, imported by the first
    greedy token (:class:`~llamapy.greedy.GreedyPick`), and the model's end-of-generation
    tokens (``ignore_eos``; a scan of the vocabulary, cached per model)."""
    with contextlib.suppress(ImportError):  # anyio's layout is its own; then nothing is warmed
        importlib.import_module("anyio._backends._asyncio")
    importlib.import_module("numpy")
    with contextlib.suppress(LlamapyError):  # failed or closed meanwhile: nothing to warm
        served.model.eog_tokens()


def _lifespan(ctx: AppContext, owned: ModelSource | None) -> Any:
    """On start: build the body validators on a thread; on shutdown: close the app's context,
    then the server if the app owns it."""
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        threading.Thread(target=warm_up, args=(ctx.source,), name="llamapy-warm-up",
                         daemon=True).start()
        yield
        if ctx.background is not None:  # (each records itself cancelled)
            await ctx.background.close()
        ctx.close()
        if owned is not None:
            owned.close()

    return lifespan


def _add_middleware(app: Starlette, ctx: AppContext, cors: CorsPolicy, max_body_bytes: int,
                    hosts: HostPolicy, shape: ErrorShape) -> None:
    """Catch-all errors, the browser guards (:mod:`llamapy.serve.guard`, refusals in ``shape``),
    request counting (refusals too), the body limit and (outermost) CORS: preflights always
    answered, ``cors``'s origins named (:mod:`llamapy.serve.cors`)."""
    policy = app.state.route_policy  # innermost: holds the request's model for its response
    for cls, keywords in ctx.source.middleware(ctx.check_key, policy):
        app.add_middleware(cls, **keywords)
    app.add_middleware(CatchAll)
    app.add_middleware(BrowserGuard, hosts=hosts, origins=cors, shape=shape)
    app.add_middleware(RequestCounter, metrics=ctx.metrics)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, shape=shape)
    app.add_middleware(CorsMiddleware, policy=cors, expose=list(CACHE_HEADERS))


def _page_router() -> Router:
    router = Router()

    @router.get("/", hidden=True)
    async def page(request: Request) -> FileResponse:
        """The chat page."""
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @router.get("/dashboard", hidden=True)
    async def dashboard(request: Request) -> FileResponse:
        """The live view of the slots, the queue and the caches (fed by
        ``/v1/llamapy/events``)."""
        return FileResponse(STATIC_DIR / "dashboard.html", media_type="text/html")

    return router
