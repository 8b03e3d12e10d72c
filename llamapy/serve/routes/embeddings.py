"""``/v1/embeddings`` on :class:`llamapy.embeddings.Embedder` (a dedicated embeddings context).

The generation ``Server`` owns its context; embeddings get their own (``--pooling`` mean,
cls or last; mean by default) on the same loaded model, touched only by the embedder's worker
thread. All inputs of a request go into one decode (split only past ``n_ctx`` tokens or
``n_seq_max`` sequences); vectors are
L2-normalised, as OpenAI's are. ``encoding_format`` ``float`` or ``base64`` (little-endian
float32). ``input`` (or llama-server's ``content``): a string, token ids (strings may be
mixed in: ``[12, "text", 34]``), ``{"prompt_string": ...}`` or ``{"content": [text parts]}``,
or a list of these, one input each.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from ...embeddings import Embedder
from ...errors import InvalidOptionError, UnsupportedFeatureError
from ...media.sources import MediaBudget
from ...openai_api import ServedModel
from ...openai_api.completions import check_token_ids
from ...openai_api.media_parts import take_media
from ...openai_api.prompt_shapes import MULTIMODAL_KEY, PROMPT_STRING_KEY, media_input
from ...options.limits import check_embedding_tokens
from ..context import cancel_on_disconnect

if TYPE_CHECKING:
    import numpy as np


def embedding_inputs(served: ServedModel, value: object) -> list[Sequence[int]]:
    """``input`` as token lists, shaped as llama-server reads it: a list with token ids at its
    top level is one input (ids and strings mixed); any other list holds one input per item (a
    string, token ids, a mixed list, ``{"prompt_string": ...}`` or ``{"content": [parts]}``);
    anything else is one input."""
    if isinstance(value, list) and not any(_is_id(v) for v in value):
        items: list[Any] = value
    else:
        items = [value]
    if not items:
        raise InvalidOptionError("input must not be empty", option="input")
    limit = served.server.start_options.engine.max_embedding_inputs
    if len(items) > limit:
        raise InvalidOptionError(f"input: at most {limit} inputs per request, got {len(items)}",
                                 option="input")
    budget = MediaBudget(served.limits.max_media_items)  # all the inputs together
    inputs = [_entry(served, item, budget) for item in items]
    check_embedding_tokens(inputs, served.server.start_options.engine)
    return inputs


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _entry(served: ServedModel, item: object, budget: MediaBudget) -> Sequence[int]:
    """One input's tokens (strings as :meth:`Embedder.tokenize` reads them; in a mixed list,
    special tokens only before a leading string); with media (``multimodal_data``, or image
    parts in ``content``), the prompt of the model's projector."""
    if isinstance(item, Mapping) and item.get(MULTIMODAL_KEY):
        return media_input(served, item.get(PROMPT_STRING_KEY), item[MULTIMODAL_KEY],
                           parse_special=False, budget=budget)
    if isinstance(item, Mapping) and PROMPT_STRING_KEY not in item:
        text, media = _content(served, item, budget)
        if media:
            return served.server.media_prompt(text, media, parse_special=False,
                                              tenant=served.tenant)
        item = text
    if isinstance(item, Mapping):
        item = item[PROMPT_STRING_KEY]
    if isinstance(item, str):
        return served.model.tokenize(item, True, False)
    if isinstance(item, list) and item and all(_is_id(v) or isinstance(v, str) for v in item):
        ids: list[int] = []
        for position, part in enumerate(item):
            ids += (served.model.tokenize(part, position == 0, False) if isinstance(part, str)
                    else check_token_ids(served, [part], where="input"))
        return ids
    raise InvalidOptionError("input items must be strings, token id lists (strings may be "
                             "mixed in), {\"prompt_string\": ...} or {\"content\": [...]} "
                             "objects", option="input")


def _content(served: ServedModel, item: Mapping[str, Any], budget: MediaBudget
             ) -> tuple[str, list[bytes]]:
    """llama-server's ``{"content": [{"type": "text", "text": ...}, ...]}`` input item as its
    text (the parts joined, each image or audio part a media marker) and its media."""
    content = item.get("content")
    if isinstance(content, list) and content:
        (message,), media = take_media(({"content": content},), served.limits,
                                       served.media_fetch, budget)
        parts = message["content"]
        if all(isinstance(p, Mapping) and p.get("type") in ("text", "media_marker")
               and isinstance(p.get("text"), str) for p in parts):
            return "".join(p["text"] for p in parts), media
    raise InvalidOptionError("an input object needs 'content': a list of "
                             "{\"type\": \"text\", \"text\": ...} parts (or image_url and "
                             "input_audio parts)", option="input")


def parse_embedding_request(served: ServedModel, request: Mapping[str, Any]
                            ) -> tuple[list[Sequence[int]], str]:
    """``(token lists, encoding_format)`` of an embeddings request (400 under ``--pooling
    none``, as llama-server's OpenAI endpoint answers: that pooling has no vector per input)."""
    if not isinstance(request, Mapping):
        raise InvalidOptionError("request body must be a JSON object")
    if served.server.start_options.context.pooling_type == "none":
        raise UnsupportedFeatureError("pooling", "/v1/embeddings needs a pooled vector per "
                                      "input; this server runs with --pooling none")
    known = {"input", "content", "model", "encoding_format", "dimensions", "user"}
    unknown = set(request) - known
    if unknown:
        raise InvalidOptionError(f"unknown field(s): {', '.join(sorted(unknown))}",
                                 option=sorted(unknown)[0])
    served.check_model(request.get("model"))
    fmt = request.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise InvalidOptionError("encoding_format must be 'float' or 'base64'",
                                 option="encoding_format")
    dims = request.get("dimensions")
    if dims is not None and dims != served.model.n_embd:
        raise UnsupportedFeatureError("dimensions", f"dimensions must be {served.model.n_embd}")
    return embedding_inputs(served, _input(request)), fmt


def _input(request: Mapping[str, Any]) -> object:
    """``input``, or llama-server's spelling ``content`` (not both)."""
    given = [key for key in ("input", "content") if key in request]
    if len(given) != 1:
        raise InvalidOptionError("give exactly one of 'input' or 'content' (its llama-server "
                                 "spelling)", option="input")
    return request[given[0]]


def embedding_response(served: ServedModel, inputs: Sequence[Sequence[int]],
                       vectors: np.ndarray, fmt: str) -> dict[str, Any]:
    """The OpenAI ``list`` of ``embedding`` objects."""
    def encode(vector: np.ndarray) -> list[float] | str:
        if fmt == "base64":
            return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
        return [float(x) for x in vector]

    n_tokens = sum(len(ids) for ids in inputs)
    return {"object": "list", "model": served.name,
            "data": [{"object": "embedding", "index": i, "embedding": encode(v)}
                     for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


async def aembed(request: Request, embedder: Embedder, inputs: Sequence[Sequence[int]]
                 ) -> np.ndarray:
    """``embedder.embed_tokens(inputs)`` without blocking the event loop; a client that goes
    away cancels it (queued, it never runs; running, it stops before its next decode)."""
    return await cancel_on_disconnect(request, embedder.aembed_tokens(inputs))
