"""The fuzzer's map of the app: every route with a valid request, the fields it reads and its
error shape; hostile values; mutated requests (:class:`Case`) and the verdict on an answer.

Field names come from the library itself (the body models, the engine's request options and
their aliases, the API extras), so a new option is fuzzed the day it is added. The routes that
only count or render a prompt get their body model's fields: they parse the extras with the
generating routes' code.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from fake_http import ALIAS, FakeApp, sse_events
from hypothesis import strategies as st

from llamapy.anthropic_api import MessagesBody
from llamapy.media.samples import png
from llamapy.ollama_api import ChatBody as OllamaChat
from llamapy.ollama_api import EmbedBody, EmbeddingsBody, GenerateBody, ModelOpBody, ShowBody
from llamapy.ollama_api.params import Options as OllamaOptions
from llamapy.openai_api.llama_compat import IGNORED_FIELDS, OWN_FIELDS
from llamapy.openai_api.params import (
    API_EXTRAS,
    ENGINE_ALIASES,
    SERVER_ONLY,
    ChatBody,
    CompletionBody,
)
from llamapy.openai_api.responses_compact import CompactBody
from llamapy.openai_api.responses_params import ResponsesBody
from llamapy.serve.routes.llama import INFILL_FIELDS
from llamapy.serve.routes.rerank import RERANK_FIELDS
from llamapy.server import server_request_option_keys

#: What a generation body may carry besides its model's fields.
EXTRAS = tuple(sorted({*server_request_option_keys(), *ENGINE_ALIASES, *API_EXTRAS}
                      - set(SERVER_ONLY)))
MESSAGES = [{"role": "user", "content": "hi"}]
#: A tiny image, base64: the valid bodies send it on every API that takes media (the fuzzed
#: app has a fake projector), so the mutations reach the media fields too.
IMAGE = base64.b64encode(png(2, 2)).decode()
IMAGE_URL = f"data:image/png;base64,{IMAGE}"
MEDIA_MESSAGES = [{"role": "user", "content": [
    {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": IMAGE_URL}}]}]


def _fields(model: Any, *more: str) -> tuple[str, ...]:
    names = {f.alias or name for name, f in model.model_fields.items()}
    return tuple(sorted(names | set(more)))


@dataclass(frozen=True)
class Route:
    """A route as the fuzzer sends to it: ``body`` is a valid request (None: no body)."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    fields: tuple[str, ...] = ()
    anthropic: bool = False
    #: Errors in Ollama's shape (``{"error": "..."}``), streams as NDJSON.
    ollama: bool = False
    query: dict[str, str] = field(default_factory=dict)
    #: A 5xx this route documents (501: the fake model has no FIM tokens).
    allowed_5xx: frozenset[int] = frozenset()


CHAT = {"messages": MEDIA_MESSAGES, "max_tokens": 4}
ANTHROPIC = {"model": ALIAS, "max_tokens": 4, "messages": [{"role": "user", "content": [
    {"type": "text", "text": "hi"},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMAGE}}]}]}
NATIVE = {"prompt": {"prompt_string": "hi <__media__>", "multimodal_data": [IMAGE]},
          "n_predict": 4}
RESPONSES = {"max_output_tokens": 4, "input": [{"role": "user", "content": [
    {"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": IMAGE_URL}]}]}
CHAT_FIELDS = _fields(ChatBody, *EXTRAS)
RESPONSES_FIELDS = _fields(ResponsesBody, *EXTRAS)
MESSAGES_FIELDS = _fields(MessagesBody, *EXTRAS)
NATIVE_FIELDS = tuple(sorted({*OWN_FIELDS, *IGNORED_FIELDS, *EXTRAS, "ignore_eos", "n_probs"}))
OLLAMA_OPTIONS = {"num_predict": 4}
OLLAMA_CHAT = {"model": ALIAS, "options": OLLAMA_OPTIONS,
               "messages": [{"role": "user", "content": "hi", "images": [IMAGE]}]}
OLLAMA_GENERATE = {"model": ALIAS, "prompt": "hi", "images": [IMAGE], "options": OLLAMA_OPTIONS}
#: The option keys the fuzzer sets inside ``options`` (as ``options.<key>``, see ``_set``).
OLLAMA_OPTION_FIELDS = tuple(f"options.{name}" for name in OllamaOptions.model_fields)


def _ollama(method: str, path: str, body: dict[str, Any] | None, fields: tuple[str, ...]
            ) -> Route:
    return Route(method, path, body, fields, ollama=True)


def _post(path: str, body: dict[str, Any], fields: tuple[str, ...], **kw: Any) -> Route:
    return Route("POST", path, body, fields, **kw)


POST_ROUTES = (
    _post("/v1/chat/completions", CHAT, CHAT_FIELDS),
    _post("/chat/completions", CHAT, CHAT_FIELDS),
    _post("/v1/completions", {"prompt": "hi", "max_tokens": 4}, _fields(CompletionBody, *EXTRAS)),
    _post("/v1/responses", RESPONSES, RESPONSES_FIELDS),
    _post("/responses", RESPONSES, RESPONSES_FIELDS),
    _post("/v1/responses/compact", {"input": "hi"}, _fields(CompactBody, *EXTRAS)),
    _post("/responses/compact", {"input": "hi"}, _fields(CompactBody, *EXTRAS)),
    _post("/v1/responses/input_tokens", {"input": "hi"}, _fields(ResponsesBody)),
    _post("/responses/input_tokens", {"input": "hi"}, _fields(ResponsesBody)),
    _post("/v1/chat/completions/input_tokens", {"messages": MESSAGES}, _fields(ChatBody)),
    _post("/chat/completions/input_tokens", {"messages": MESSAGES}, _fields(ChatBody)),
    _post("/v1/messages", ANTHROPIC, MESSAGES_FIELDS, anthropic=True),
    _post("/v1/messages/count_tokens", {"model": ALIAS, "messages": MESSAGES},
          _fields(MessagesBody), anthropic=True),
    _post("/completion", NATIVE, NATIVE_FIELDS),
    _post("/completions", NATIVE, NATIVE_FIELDS),
    _post("/infill", {"input_prefix": "a", "input_suffix": "b", "n_predict": 4},
          (*INFILL_FIELDS, "n_predict"), allowed_5xx=frozenset({501})),
    _post("/tokenize", {"content": "hi", "with_pieces": True},
          ("add_special", "content", "parse_special", "with_pieces")),
    _post("/detokenize", {"tokens": [72, 105]}, ("tokens",)),
    _post("/apply-template", {"messages": MESSAGES}, _fields(ChatBody)),
    _post("/props", {}, ("n_ctx", "default_generation_settings")),
    _post("/slots/{id_slot}", {"filename": "fuzz.bin"}, ("filename",),
          query={"action": "save"}),
    _post("/v1/embeddings", {"input": [{"content": MEDIA_MESSAGES[0]["content"]}]},
          ("content", "dimensions", "encoding_format", "input", "model", "user")),
    _post("/embeddings", {"content": [{"prompt_string": "hi <__media__>",
                                       "multimodal_data": [IMAGE]}]}, ("content",)),
    *(_post(path, {"query": "q", "documents": ["a", "b"]}, RERANK_FIELDS,
            allowed_5xx=frozenset({501}))  # the fake model is no reranker: always 501
      for path in ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking")),
    _ollama("POST", "/api/chat", OLLAMA_CHAT, _fields(OllamaChat, *OLLAMA_OPTION_FIELDS)),
    _ollama("POST", "/api/generate", OLLAMA_GENERATE,
            _fields(GenerateBody, *OLLAMA_OPTION_FIELDS)),
    _ollama("POST", "/api/embed", {"model": ALIAS, "input": "hi"}, _fields(EmbedBody)),
    _ollama("POST", "/api/embeddings", {"model": ALIAS, "prompt": "hi"},
            _fields(EmbeddingsBody)),
    _ollama("POST", "/api/show", {"model": ALIAS}, _fields(ShowBody)),
    _ollama("POST", "/api/pull", {"model": ALIAS, "stream": False}, _fields(ModelOpBody)),
    _ollama("POST", "/api/push", {"model": ALIAS}, _fields(ModelOpBody)),
    _ollama("POST", "/api/create", {"model": "x", "from": ALIAS}, _fields(ModelOpBody)),
    _ollama("POST", "/api/copy", {"source": ALIAS, "destination": "x"}, _fields(ModelOpBody)),
    _ollama("DELETE", "/api/delete", {"model": ALIAS}, _fields(ModelOpBody)),
)
#: Stored responses and conversations (ids of nothing stored: every answer a 4xx or a 200).
STORED_ROUTES = tuple(
    route for prefix in ("/v1", "") for route in (
        Route("GET", f"{prefix}/responses/{{response_id}}"),
        Route("DELETE", f"{prefix}/responses/{{response_id}}"),
        Route("GET", f"{prefix}/responses/{{response_id}}/input_items",
              query={"limit": "5", "order": "asc"}),
        Route("POST", f"{prefix}/responses/{{response_id}}/cancel", {}),
        _post(f"{prefix}/conversations", {"items": MESSAGES, "metadata": {"k": "v"}},
              ("items", "metadata")),
        Route("GET", f"{prefix}/conversations/{{conversation_id}}"),
        _post(f"{prefix}/conversations/{{conversation_id}}", {"metadata": {"k": "v"}},
              ("metadata",)),
        Route("DELETE", f"{prefix}/conversations/{{conversation_id}}"),
        _post(f"{prefix}/conversations/{{conversation_id}}/items", {"items": MESSAGES},
              ("items",)),
        Route("GET", f"{prefix}/conversations/{{conversation_id}}/items"),
        Route("GET", f"{prefix}/conversations/{{conversation_id}}/items/{{item_id}}"),
        Route("DELETE", f"{prefix}/conversations/{{conversation_id}}/items/{{item_id}}")))
GET_ROUTES = tuple(Route("GET", path) for path in (
    "/health", "/v1/health", "/props", "/slots", "/metrics", "/v1/models", "/models",
    "/v1/models/{model_id:path}", "/openapi.json", "/", "/dashboard"))
OLLAMA_GET_ROUTES = tuple(_ollama("GET", path, None, ())
                          for path in ("/api/tags", "/api/ps", "/api/version"))
ROUTES = POST_ROUTES + STORED_ROUTES + GET_ROUTES + OLLAMA_GET_ROUTES
#: Routes the fuzzer does not send to, and why.
NOT_FUZZED = {
    ("GET", "/v1/llamapy/events"): "an endless SSE feed: the in-process client cannot hang up",
}
#: Error ``type`` values of a 5xx (OpenAI's and Anthropic's spellings).
SERVER_ERROR_TYPES = frozenset({"server_error", "timeout", "api_error", "overloaded_error",
                                "timeout_error"})

# --- hostile values ---------------------------------------------------------------------------

HUGE_INTS = (-1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**31),
             -(2**63), -(2**63) - 1, 10**30)
NASTY_STRINGS = ("", "\x00", "\u202e\ufeff", "<|im_end|>", 'root ::= "x"', "../x", "{{ 7*7 }}",
                 "x" * 20_000, "é" * 3000,
                 "hf.co/evil/x", "ORG/REPO", "../../etc",  # model names that would pull elsewhere
                 # media URLs to loopback (the fuzzed app fetches remote media)
                 "http://0177.0.0.1/", "http://[::ffff:127.0.0.1]/", "http://64:ff9b::7f00:1/")
NESTED = ([[1]], [[]], [{"a": 1}], {"a": [1]}, [[1, [2]]], {"": {}}, [None], [[1]] * 3)
#: One of each class, for the systematic sweep (see ``test_http_fake_fuzz``).
SWEEP_VALUES: tuple[Any, ...] = (None, "x", 1.5, -1, 2**32, 2**63, [[1]], ["x"] * 3000)
#: Whole bodies of the sweep (``None``: no body at all; the raw ones are :data:`RAW_BODIES`).
SWEEP_BODIES: tuple[Any, ...] = (None, False, 0, "x", [], [[1]], {"": None})
SWEEP_PARAMS = ("-1", "99", str(2**63), "x", "%00")

scalars = st.one_of(
    st.none(), st.booleans(), st.sampled_from(HUGE_INTS), st.integers(),
    st.floats(), st.sampled_from(NASTY_STRINGS), st.text(max_size=30),
)
values = st.one_of(
    scalars,
    st.sampled_from(NESTED),
    st.recursive(scalars, lambda kids: st.lists(kids, max_size=4)
                 | st.dictionaries(st.text(max_size=6), kids, max_size=4), max_leaves=8),
    st.builds(lambda item, n: [item] * n, scalars, st.sampled_from([100, 5000])),
)
CONTENT_TYPES = ("application/json", "text/plain", "application/x-www-form-urlencoded",
                 "multipart/form-data; boundary=x", "application/json; charset=latin-1", "",
                 "*/*", "application/json\x7f")
HEADER_NAMES = ("accept", "authorization", "x-api-key", "anthropic-version", "anthropic-beta",
                "origin", "user-agent", "accept-encoding", "content-encoding", "x-request-id",
                "cookie", "accept-language")
RAW_BODIES = (b"", b"{", b"null", b"[]", b'"x"', b"1e999", b"NaN", b'{"a": NaN}',
              b"\xff\xfe{}", b'{"max_tokens": Infinity}', b"[" * 5000 + b"]" * 5000,
              b'{"messages": "\\ud800"}', b"\xef\xbb\xbf{}")

# --- cases ------------------------------------------------------------------------------------


@dataclass
class Case:
    """One request; its repr is code that sends it again (``Case(...).send(app)``).
    ``body`` is sent as JSON (``None``: no body), else ``raw`` as it is."""

    method: str
    route: str
    path: str
    body: Any = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)

    def send(self, app: FakeApp) -> httpx.Response:
        """Send it (JSON with ``NaN`` / ``Infinity`` as Python's ``json`` writes them)."""
        content = self.raw
        if content is None and self.body is not None:
            content = json.dumps(self.body, allow_nan=True).encode()
        headers = dict(self.headers)
        if content is not None:
            headers.setdefault("content-type", "application/json")
        return app.send(self.method, self.path, content=content, headers=headers,
                        params=self.query)


def sweep_cases(route: Route) -> Iterator[Case]:
    """The systematic sweep of a route: each field set to each of :data:`SWEEP_VALUES`, each
    whole body of :data:`SWEEP_BODIES` and :data:`RAW_BODIES`, each odd path parameter."""
    def case(body: Any = None, raw: bytes | None = None, param: str = "0") -> Case:
        return Case(route.method, route.path, concrete_path(route, param), body, raw,
                    query=dict(route.query))

    if route.body is not None:
        for name in route.fields:
            for value in SWEEP_VALUES:
                yield case(with_field(route.body, name, value))
        yield from (case(body) for body in SWEEP_BODIES)
        yield from (case(raw=raw) for raw in RAW_BODIES)
    if "{" in route.path:
        yield from (case(route.body, param=param) for param in SWEEP_PARAMS)


def with_field(body: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    """``body`` with field ``name`` set to ``value`` (``options.<key>``: inside ``options``)."""
    head, dot, key = name.partition(".")
    if dot and head == "options":
        options = body.get("options")
        return {**body, "options": {**(options if isinstance(options, dict) else {}), key: value}}
    return {**body, name: value}


def concrete_path(route: Route, param: str = "0") -> str:
    """The route's path with its parameter filled in."""
    return re.sub(r"\{[a-z_]+(?::path)?\}", lambda _: param, route.path)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON value (the value itself first)."""
    out = [at]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*at, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*at, index))
    return out


def _replaced(value: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    head, rest = at[0], at[1:]
    if isinstance(value, dict):
        return {**value, head: _replaced(value[head], rest, new)}
    return [_replaced(item, rest, new) if i == head else item for i, item in enumerate(value)]


@st.composite
def mutated_body(draw: st.DrawFn, route: Route) -> Any:
    """The route's valid body with one to three fields set, added, removed or replaced deep
    down (an empty body may be replaced whole)."""
    body: Any = dict(route.body or {})
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(("field", "field", "field", "deep", "unknown", "drop")))
        if kind == "field" and route.fields:
            body = with_field(body, draw(st.sampled_from(route.fields)), draw(values))
        elif kind == "deep":
            at = draw(st.sampled_from(_paths(body)[1:] or [()]))
            body = _replaced(body, at, draw(values))
        elif kind == "unknown":
            body[draw(st.text(min_size=1, max_size=12))] = draw(values)
        elif body:
            body.pop(draw(st.sampled_from(sorted(body))))
        if not isinstance(body, dict):
            break
    return body


@st.composite
def cases(draw: st.DrawFn, routes: tuple[Route, ...] = ROUTES) -> Case:
    """A request to one of ``routes``: mostly a mutated valid body; sometimes a hostile whole
    body, raw bytes, odd headers, another content type or path parameter."""
    route = draw(st.sampled_from(routes))
    param = draw(st.sampled_from(("0", "1", ALIAS)) | st.sampled_from(
        ("-1", "99", str(2**63), "x", "%00", "..", "fake.gguf")))
    case = Case(route.method, route.path, concrete_path(route, param), query=dict(route.query))
    if route.method in ("POST", "DELETE"):
        shape = draw(st.sampled_from(("mutated",) * 6 + ("whole", "raw")))
        if shape == "mutated":
            case.body = draw(mutated_body(route))
        elif shape == "whole":
            case.body = draw(values)
        else:
            case.raw = draw(st.sampled_from(RAW_BODIES) | st.binary(max_size=40))
        if draw(st.integers(0, 4)) == 0:
            case.headers["content-type"] = draw(st.sampled_from(CONTENT_TYPES))
    if draw(st.integers(0, 3)) == 0:
        case.headers.update(draw(st.dictionaries(
            st.sampled_from(HEADER_NAMES),
            st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
            max_size=3)))
    if draw(st.integers(0, 4)) == 0:
        case.query.update(draw(st.dictionaries(st.sampled_from(("action", "model", "x")),
                                               st.text(max_size=10), max_size=2)))
    return case


# --- verdict ----------------------------------------------------------------------------------


def route_of(case: Case) -> Route:
    """The catalogue entry of a case."""
    return next(r for r in ROUTES if (r.method, r.path) == (case.method, case.route))


def check_answer(route: Route, response: httpx.Response) -> None:
    """A 2xx, or a 4xx in the route's error shape; a 5xx only where the route documents it;
    a stream's error events never of a server error's type."""
    status = response.status_code
    assert status < 500 or status in route.allowed_5xx, \
        f"{status} from {route.method} {route.path}: {response.text[:500]}"
    if status >= 400:
        check_error_shape(route, response)
    elif response.headers.get("content-type", "").startswith("application/x-ndjson"):
        for line in response.text.splitlines():
            error = json.loads(line).get("error")
            assert error is None or not error.startswith("internal error"), \
                f"stream from {route.path} failed: {line[:500]}"
    elif response.headers.get("content-type", "").startswith("text/event-stream"):
        for _, data in sse_events(response.text):
            error = _error_of(data)
            assert error is None or error.get("type") not in SERVER_ERROR_TYPES, \
                f"stream from {route.path} failed: {data[:500]}"


def check_error_shape(route: Route, response: httpx.Response) -> None:
    """OpenAI's ``{"error": {"message", "type", ...}}`` (llama-server's routes too) or, on the
    Anthropic routes, ``{"type": "error", "error": {"type", "message"}}``."""
    body = response.json()
    if route.ollama:
        assert isinstance(body, dict) and set(body) == {"error"}, body
        assert isinstance(body["error"], str) and body["error"], body
        return
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    error = body["error"]
    assert isinstance(error.get("message"), str) and isinstance(error.get("type"), str), body
    if route.anthropic:
        assert body["type"] == "error" and set(body) == {"type", "error"}, body
    else:
        assert set(body) == {"error"}, body


def _error_of(data: str) -> dict[str, Any] | None:
    try:
        item = json.loads(data)
    except ValueError:
        return None
    error = item.get("error") if isinstance(item, dict) else None
    return error if isinstance(error, dict) else None
