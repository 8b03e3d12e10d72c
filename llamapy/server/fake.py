"""A :class:`~llamapy.server.Server` on the fake backend: the serving stack without libllama.

``fake_server(**options)`` takes a real server's start options (``n_ctx``, ``n_parallel``,
``n_batch``, ``max_queue``, sampling defaults, ...). Its tick thread hosts an
:class:`~llamapy.engine.Engine` on a :class:`~llamapy.engine.FakeBackend` sized by them,
and its model is a :class:`~llamapy.engine.fake.text.FakeTextModel` (byte tokenizer, ChatML
template): ``create_app(fake_server())`` serves every route in-process, deterministically and
in milliseconds. Importing or serving it never loads libllama.

What the fake backend does not have: a draft model (``spec_draft_model`` fails the load with
:class:`~llamapy.errors.UnsupportedFeatureError`), LoRA files (an adapter set only salts the fake
model's tokens), an embeddings context (serve the app with ``embeddings=False``) and FIM tokens
(``/infill`` answers 501). With ``pooling_type="rank"`` its backend pools (every request
scored, none generating), as a reranker's context. Its projector (any ``mmproj`` value) is
:class:`~llamapy.media.FakeMediaEncoder`: it takes images, and audio when the value says
``audio``; its chunks must be decoded whole (Gemma 3's kind) when it says ``bidirectional``.
"""

from __future__ import annotations

import os
from typing import Any

from ..engine.cache.disk_format import CacheNamespace
from ..engine.engine import Engine
from ..engine.fake.backend import DeviceCost, FakeBackend
from ..engine.fake.text import FakeTextModel
from ..errors import UnsupportedFeatureError
from ..media.fake import FakeMediaEncoder
from ..runtime import Hosted
from .options import ResolvedStart
from .server import Server

__all__ = ["fake_server", "host_fake"]


def fake_server(model_path: str | os.PathLike[str] = "fake.gguf", *,
                model: FakeTextModel | None = None, sleep_s: float = 0.0,
                device_step_s: float | None = None, device: DeviceCost | None = None,
                **options: Any) -> Server:
    """A server on the fake backend (see the module). ``model``: the fake model (default: a
    :class:`FakeTextModel` named after ``model_path``); ``sleep_s``: seconds each decode
    really sleeps (to hold requests in flight); ``device_step_s`` (or a whole ``device``
    cost): an asynchronous device whose decode returns at once and whose outputs are
    readable that much later (a GPU step, see :class:`~llamapy.engine.fake.device.DeviceCost`)."""
    text_model = model or FakeTextModel(str(model_path))
    if device is None and device_step_s is not None:
        device = DeviceCost(device_step_s)
    return Server.hosting(
        lambda start: host_fake(start, text_model, sleep_s=sleep_s, device=device),
        model_path, **options)


def host_fake(start: ResolvedStart, model: FakeTextModel, *, sleep_s: float = 0.0,
              device: DeviceCost | None = None) -> Hosted:
    """An engine on a fake backend sized by ``start``, with ``model`` as the hosted model."""
    if start.server.spec_draft_model:
        raise UnsupportedFeatureError("spec_draft_model", "the fake backend has no draft model")
    backend = FakeBackend(n_ctx=start.server.n_ctx, n_seq_max=start.server.n_parallel,
                          n_batch=start.server.effective_n_batch,
                          kv_unified=start.engine.kv_unified, model=model.fake, sleep_s=sleep_s,
                          device=device,
                          pools=start.context.pooling_type == "rank",
                          n_ubatch=start.context.n_ubatch)
    namespace = None
    if start.engine.prompt_cache_dir:
        namespace = CacheNamespace(f"llamapy-fake:{model.description}")
    engine = Engine(backend, start.engine, cache_namespace=namespace)
    media = None
    if start.server.mmproj:  # any value: the fake projector (see the module)
        name = start.server.mmproj
        media = FakeMediaEncoder(model.tokenize, audio="audio" in name,
                                 causal="bidirectional" not in name)
    return Hosted(engine=engine, model=model, media=media)
