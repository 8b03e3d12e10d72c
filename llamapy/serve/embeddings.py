"""``/v1/embeddings``: a dedicated embeddings context, owned by one worker thread.

The generation ``Server`` owns its context; embeddings get their own (``embeddings=True``,
mean pooling) on the same loaded model, created on first use by a single-thread executor that
is the only thread ever touching it. All inputs of a request go into one decode (split only
when they exceed ``n_batch`` tokens or ``n_seq_max`` sequences); vectors are L2-normalised, as
OpenAI's are. ``encoding_format`` ``float`` or ``base64`` (little-endian float32).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .._native import Batch, Context, Model
from ..errors import ContextOverflowError, InvalidOptionError, UnsupportedFeatureError
from ..openai_api import ServedModel
from ..openai_api.completions import check_token_ids


class Embedder:
    """Mean-pooled embeddings of one model on a private context and thread."""

    def __init__(self, model: Model, *, n_ctx: int = 2048, n_seq_max: int = 16,
                 n_threads: int = 0) -> None:
        self.model = model
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self.n_threads = n_threads
        self._ctx: Context | None = None
        self._batch: Batch | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="llamapy-embed")

    def _context(self) -> tuple[Context, Batch]:
        if self._ctx is None:
            self._ctx = Context(self.model, n_ctx=self.n_ctx, n_batch=self.n_ctx,
                                n_ubatch=self.n_ctx, n_seq_max=self.n_seq_max,
                                embeddings=True, pooling_type="mean", kv_unified=True,
                                n_threads=self.n_threads)
            self._batch = Batch(self.n_ctx)
        assert self._batch is not None
        return self._ctx, self._batch

    def _groups(self, inputs: Sequence[list[int]]) -> list[list[int]]:
        """Indexes of ``inputs`` per decode: within ``n_ctx`` tokens and ``n_seq_max``."""
        groups: list[list[int]] = [[]]
        used = 0
        for index, ids in enumerate(inputs):
            if not ids:
                raise InvalidOptionError(f"input[{index}] is empty", option="input")
            if len(ids) > self.n_ctx:
                raise ContextOverflowError(stage="embed", resident_tokens=0,
                                           additional_tokens=len(ids), n_ctx=self.n_ctx)
            if used + len(ids) > self.n_ctx or len(groups[-1]) == self.n_seq_max:
                groups.append([])
                used = 0
            groups[-1].append(index)
            used += len(ids)
        return groups

    def embed(self, inputs: Sequence[list[int]]) -> list[np.ndarray]:
        """L2-normalised embeddings of token lists (runs on the calling thread: use
        :meth:`aembed` or :meth:`embed_sync` from other threads)."""
        ctx, batch = self._context()
        out: list[np.ndarray] = [np.empty(0)] * len(inputs)
        for group in self._groups(inputs):
            ctx.clear()
            batch.clear()
            for seq_id, index in enumerate(group):
                batch.add(seq_id, 0, inputs[index], logits_last=True)
            ctx.decode(batch)
            for seq_id, index in enumerate(group):
                vector = ctx.sequence_embeddings(seq_id)
                norm = float(np.linalg.norm(vector))
                out[index] = vector / norm if norm > 0 else vector
        ctx.clear()
        return out

    def embed_sync(self, inputs: Sequence[list[int]]) -> list[np.ndarray]:
        """:meth:`embed` on the embedder's own thread (blocking)."""
        return self._executor.submit(self.embed, inputs).result()

    async def aembed(self, inputs: Sequence[list[int]]) -> list[np.ndarray]:
        """:meth:`embed` on the embedder's own thread, awaited."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.embed, inputs)

    def close(self) -> None:
        """Free the context (on its thread) and stop the thread; idempotent."""
        def free() -> None:
            if self._ctx is not None:
                self._ctx.close()
                self._ctx = None

        self._executor.submit(free).result()
        self._executor.shutdown(wait=True)


def embedding_inputs(served: ServedModel, value: object) -> list[list[int]]:
    """``input`` as token lists: a string, a list of strings, token ids, or lists of them."""
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        items = [value]
    elif isinstance(value, list) and value:
        items = value
    else:
        raise InvalidOptionError("input must be a string, a list of strings or token ids",
                                 option="input")
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(served.model.tokenize(item, True, False))
        elif isinstance(item, list):
            out.append(check_token_ids(served, item, where="input"))
        else:
            raise InvalidOptionError("input items must be strings or token id lists",
                                     option="input")
    return out


def parse_embedding_request(served: ServedModel, request: Mapping[str, Any]
                            ) -> tuple[list[list[int]], str]:
    """``(token lists, encoding_format)`` of an embeddings request."""
    if not isinstance(request, Mapping):
        raise InvalidOptionError("request body must be a JSON object")
    known = {"input", "model", "encoding_format", "dimensions", "user"}
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
    if "input" not in request:
        raise InvalidOptionError("missing field 'input'", option="input")
    return embedding_inputs(served, request["input"]), fmt


def embedding_response(served: ServedModel, inputs: Sequence[list[int]],
                       vectors: Sequence[np.ndarray], fmt: str) -> dict[str, Any]:
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
