"""What a ``Server``'s tick thread hosts: the model loaded from the start options, its context,
backend and engine (built on that thread by :func:`load_server`)."""

from __future__ import annotations

from .._native import Model
from .._native.prefetch import take
from .._system import physical_cores
from ..fingerprint import start_fingerprint
from ..runtime.hosting import Hosted
from ..runtime.native import host_model
from .options import ResolvedStart

__all__ = ["FINGERPRINT_DELAY_S", "load_server"]

#: Seconds after a model is hosted before its file's fingerprint starts in the background (a
#: start and the requests right after it do not share the CPU with the hash).
FINGERPRINT_DELAY_S = 1.0


def load_server(start: ResolvedStart) -> Hosted:
    """Load the model (and the draft model, if any) and host an engine on it; the ``lora``
    start adapters are preloaded. A failure frees what was made (the models included) and
    raises. A model prefetched for the same file and load options (see
    :mod:`llamapy._native.prefetch`) is taken instead of loading the file again. The file's
    fingerprint starts :data:`FINGERPRINT_DELAY_S` after it is hosted, on a background thread
    at idle priority (:func:`~llamapy.fingerprint.start_fingerprint`), off the start's path."""
    path = start.server.model_path
    model = take(path, start.model) or Model(path, start.model)
    draft: Model | None = None
    try:
        if start.server.spec_draft_model:
            draft = Model(start.server.spec_draft_model, start.model)
        preload = tuple((path, 1.0) for path in start.server.lora)
        hosted = host_model(model, start.context, start.engine, preload, draft_model=draft,
                            warmup=start.server.warmup)
        if start.server.mmproj:
            _attach_media(hosted, start, model)
    except BaseException:
        model.close()
        if draft is not None:
            draft.close()
        raise
    start_fingerprint(path, delay=FINGERPRINT_DELAY_S)  # for sessions and slot files
    return hosted


def _attach_media(hosted: Hosted, start: ResolvedStart, model: Model) -> None:
    """Load the start's projector for ``model`` into ``hosted`` (freed before the rest); a
    failure frees what ``hosted`` holds and raises."""
    from ..media.encoder import MediaEncoder

    assert start.server.mmproj is not None
    try:
        encoder = MediaEncoder.load(start.server.mmproj, model,
                                    use_gpu=start.server.mmproj_offload,
                                    n_threads=start.context.n_threads or physical_cores())
    except BaseException:
        hosted.engine.close()
        hosted.free()
        raise
    free = hosted.free

    def free_all() -> None:
        encoder.close()
        free()

    hosted.media, hosted.free = encoder, free_all
