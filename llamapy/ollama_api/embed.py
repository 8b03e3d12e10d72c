"""Ollama's embeddings: ``/api/embed`` (``input``: a string or a list) and the legacy
``/api/embeddings`` (``prompt`` -> ``embedding``).

Inputs are tokenized as :class:`~llamapy.embeddings.Embedder` does; vectors are the
embedder's (pooled, L2-normalised, as Ollama's are). ``truncate`` (default true) cuts an input
longer than the embedder's context to fit, ``truncate: false`` makes it a 400; ``dimensions``
is accepted only when it is the model's width (no vector is shortened). At most the engine's
``max_embedding_inputs`` inputs per request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidOptionError, UnsupportedFeatureError
from ..openai_api.target import ServedModel
from ..options.limits import check_embedding_tokens
from .options import served_name
from .params import EmbedBody


def embed_inputs(served: ServedModel, body: EmbedBody, n_ctx: int) -> list[list[int]]:
    """The token lists of ``body``'s inputs, each within ``n_ctx`` tokens (blocking:
    tokenizes)."""
    served_name(served, body.model)
    if body.dimensions is not None and body.dimensions != served.model.n_embd:
        raise UnsupportedFeatureError(
            "dimensions", f"dimensions must be the model's width ({served.model.n_embd})")
    texts = [body.input] if isinstance(body.input, str) else body.input
    limit = served.server.start_options.engine.max_embedding_inputs
    if len(texts) > limit:
        raise InvalidOptionError(f"input: at most {limit} inputs per request, got {len(texts)}",
                                 option="input")
    out = []
    for i, text in enumerate(texts):
        ids = served.model.tokenize(text, True, False)
        if not ids:
            raise InvalidOptionError(f"input[{i}] is empty", option="input")
        if len(ids) > n_ctx and not body.truncate:
            raise InvalidOptionError(
                f"input[{i}] has {len(ids)} tokens, more than the context ({n_ctx}); "
                "set truncate to true to cut it", option="input")
        out.append(ids[:n_ctx])
    check_embedding_tokens(out, served.server.start_options.engine)
    return out


def embed_response(model: str, vectors: Sequence[Sequence[float]], inputs: list[list[int]],
                   started_ns: int) -> dict[str, Any]:
    """The ``/api/embed`` object."""
    return {"model": model, "embeddings": [[float(x) for x in row] for row in vectors],
            "total_duration": time.perf_counter_ns() - started_ns, "load_duration": 0,
            "prompt_eval_count": sum(len(ids) for ids in inputs)}
