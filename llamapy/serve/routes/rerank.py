"""``/rerank`` (also ``/v1/rerank``, ``/reranking``, ``/v1/reranking``): a reranker scores
documents against a query, as llama-server's ``--reranking`` does.

The served model must be a reranker (a classifier head) and the server started with
``--reranking`` (``--pooling rank``); otherwise the route answers llama-server's 501. Each
(query, document) pair becomes one input (:func:`llamapy.embeddings.rerank_tokens`), scored
by the server's engine (:meth:`~llamapy.server.Server.ascore_tokens`): the pairs of every
request in flight share its decodes, each pair whole (at most ``--ubatch-size`` tokens, and
no more than the model's trained context), the request's tenant accounted.

Two shapes, as llama-server answers them: Jina's and Cohere's (``documents``: strings, or
objects with a ``text``; ``top_n``; ``return_documents`` adds each ``document``) gives
``{"model", "object": "list", "usage", "results": [{"index", "relevance_score"}]}``;
Hugging Face TEI's (``texts``; ``return_text``; ``truncate`` cuts a pair longer than the
model's context, keeping its start, or its end with ``truncation_direction`` ``Left``) gives
the bare list of ``{"index", "score"}``. Results come best first; scores are the model's raw
outputs (TEI's ``raw_scores`` is accepted: they are raw either way, as llama-server's are).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from ...embeddings import RANK, rerank_tokens
from ...errors import EndpointDisabledError, InvalidOptionError, UnknownOptionError
from ...openai_api import ServedModel
from ...options.limits import check_embedding_tokens
from ..context import AppContext, cancel_on_disconnect, read_json
from ..model_use import ON_MODEL
from ..routing import Router

__all__ = ["RERANK_FIELDS", "RerankRequest", "parse_rerank", "rerank_response", "rerank_router"]

#: The fields a rerank body may have.
RERANK_FIELDS = ("model", "query", "documents", "texts", "top_n", "return_documents",
                 "return_text", "raw_scores", "truncate", "truncation_direction")


@dataclass(frozen=True, slots=True)
class RerankRequest:
    """A validated rerank request: the documents' texts, each pair's tokens, the shape."""

    model: str | None
    texts: tuple[str, ...]
    inputs: tuple[list[int], ...]
    top_n: int
    tei: bool
    return_text: bool


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise InvalidOptionError(f"{key} must be a boolean", option=key)
    return value


def _documents(body: Mapping[str, Any], limit: int) -> tuple[tuple[str, ...], bool]:
    """The documents' texts and whether the body is TEI's (``texts``)."""
    given = [key for key in ("documents", "texts") if key in body]
    if len(given) != 1:
        raise InvalidOptionError("give exactly one of 'documents' or 'texts'",
                                 option="documents")
    key = given[0]
    items = body[key]
    if not isinstance(items, list) or not items:
        raise InvalidOptionError(f"\"{key}\" must be a non-empty string array", option=key)
    if len(items) > limit:
        raise InvalidOptionError(f"{key}: at most {limit} documents per request, got "
                                 f"{len(items)}", option=key)
    texts = []
    for i, item in enumerate(items):
        if isinstance(item, Mapping) and key == "documents":
            item = item.get("text")
        if not isinstance(item, str):
            raise InvalidOptionError(f"{key}[{i}] must be a string (or an object with a "
                                     "string 'text')", option=key)
        texts.append(item)
    return tuple(texts), key == "texts"


def _truncation(body: Mapping[str, Any], max_input: int) -> slice | None:
    """TEI's ``truncate``: the slice keeping the first (``truncation_direction`` ``Right``,
    the default) or last ``max_input`` tokens of a pair; None: a pair too long is a 400."""
    direction = body.get("truncation_direction", "Right")
    if direction not in ("Right", "Left"):
        raise InvalidOptionError("truncation_direction must be 'Right' or 'Left'",
                                 option="truncation_direction")
    _flag(body, "raw_scores")  # (the scores are the model's raw outputs either way)
    if not _flag(body, "truncate"):
        return None
    return slice(None, max_input) if direction == "Right" else slice(-max_input, None)


def _pairs(served: ServedModel, query: str, texts: Sequence[str], cut: slice | None
           ) -> tuple[list[int], ...]:
    """Each document's pair with ``query`` (tokenized once; ``cut`` to fit), refused as soon
    as the pairs together pass ``max_embedding_tokens``: the work before the refusal is
    bounded by the limit, not by the body."""
    model, limits = served.model, served.server.start_options.engine
    query_tokens = model.tokenize(query, False, False)
    check_embedding_tokens([query_tokens], limits, "query")
    pairs: list[list[int]] = []
    total = 0
    for text in texts:
        pair = rerank_tokens(model, query, text, query_tokens)
        pairs.append(pair if cut is None else pair[cut])
        total += len(pairs[-1])
        if total > limits.max_embedding_tokens:
            check_embedding_tokens(pairs, limits, "documents")  # raises, naming the limit
    return tuple(pairs)


def parse_rerank(served: ServedModel, body: object, max_input: int = 512) -> RerankRequest:
    """Validate a rerank body and tokenize its pairs (blocking: run it off the event loop);
    ``max_input``: the longest pair the server scores (where ``truncate`` cuts)."""
    if not isinstance(body, Mapping):
        raise InvalidOptionError("request body must be a JSON object")
    unknown = [key for key in body if key not in RERANK_FIELDS]
    if unknown:
        raise UnknownOptionError(unknown, RERANK_FIELDS, where="request")
    served.check_model(body.get("model"))
    query = body.get("query")
    if not isinstance(query, str):
        raise InvalidOptionError("\"query\" must be provided, as a string", option="query")
    limit = served.server.start_options.engine.max_embedding_inputs
    texts, tei = _documents(body, limit)
    top_n = body.get("top_n", len(texts))
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
        raise InvalidOptionError("top_n must be an integer >= 0", option="top_n")
    inputs = _pairs(served, query, texts, _truncation(body, max_input))
    return RerankRequest(model=body.get("model"), texts=texts, inputs=inputs, top_n=top_n,
                         tei=tei, return_text=_flag(body, "return_text" if tei
                                                    else "return_documents"))


def rerank_response(served: ServedModel, request: RerankRequest, scores: Sequence[float]
                    ) -> Any:
    """The answer in the request's shape (see the module), best first, ``top_n`` of them."""
    label = "score" if request.tei else "relevance_score"
    results: list[dict[str, Any]] = []
    for index, score in sorted(enumerate(scores), key=lambda pair: -pair[1]):
        entry: dict[str, Any] = {"index": index, label: score}
        if request.return_text:
            text = request.texts[index]
            entry.update({"text": text} if request.tei else {"document": {"text": text}})
        results.append(entry)
    results = results[:request.top_n]
    if request.tei:
        return results
    n_tokens = sum(len(ids) for ids in request.inputs)
    return {"model": request.model or served.name, "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "results": results}


def rerank_router(ctx: AppContext) -> Router:
    """The rerank routes (behind the API key; see the module)."""
    router = Router(checks=[ctx.check_key], model=ON_MODEL)

    @router.post("/v1/rerank")
    @router.post("/rerank", hidden=True)
    @router.post("/reranking", hidden=True)
    @router.post("/v1/reranking", hidden=True)
    async def rerank(request: Request) -> Any:
        """Documents scored against a query by the served reranker, best first."""
        body = await read_json(request)
        served = ctx.served(request)
        if served.server.start_options.context.pooling_type != RANK:
            raise EndpointDisabledError("This server does not support reranking. Start it "
                                        "with `--reranking`")
        server = served.server
        parsed = await asyncio.to_thread(parse_rerank, served, body, server.max_pooled_tokens)
        scores = await cancel_on_disconnect(request, server.ascore_tokens(
            parsed.inputs, tenant=served.tenant, timeout=served.request_timeout))
        return rerank_response(served, parsed, scores)

    return router
