"""The checks a request's media passes before anything decodes or encodes it (no native code
here: the API layers and the fake projector use them too)."""

from __future__ import annotations

from collections.abc import Sequence

from llamapy.engine.media import MediaPrompt
from llamapy.errors import MediaError
from llamapy.options.limits import RequestLimits

from .probe import MediaInfo, probe

__all__ = ["check_media_items", "check_physical_batch", "no_projector"]


def check_media_items(media: Sequence[bytes], limits: RequestLimits,
                      modalities: dict[str, bool]) -> list[MediaInfo]:
    """Each item's kind and size, refused (:class:`~llamapy.errors.MediaError`) unless it is
    a format :func:`.probe.probe` reads, within ``limits`` and of a kind in ``modalities``
    (``"vision"`` for images, ``"audio"``). Nothing is decoded."""
    if len(media) > limits.max_media_items:
        raise MediaError(f"at most {limits.max_media_items} images and audio clips per "
                         f"request, got {len(media)}", reason="too_many")
    infos = []
    for data in media:
        if len(data) > limits.max_media_bytes:
            raise MediaError(f"a media item of {len(data)} bytes is larger than the "
                             f"{limits.max_media_bytes} bytes allowed", reason="too_large")
        info = probe(data)
        if info.pixels > limits.max_media_pixels:
            raise MediaError(f"a {info.width}x{info.height} image is larger than the "
                             f"{limits.max_media_pixels} pixels allowed", reason="too_large")
        if not modalities["vision" if info.kind == "image" else "audio"]:
            raise MediaError(f"this model's projector does not take {info.kind}",
                             reason="kind")
        infos.append(info)
    return infos


def check_physical_batch(prompt: MediaPrompt, n_ubatch: int) -> MediaPrompt:
    """``prompt``, unless a chunk decoded in one batch (not causal) has more rows than
    ``n_ubatch``, the context's physical batch (then :class:`~llamapy.errors.MediaError`)."""
    for span in prompt.media:
        if not span.chunk.causal and span.chunk.n_tokens > n_ubatch:
            raise MediaError(f"this model's media chunks of {span.chunk.n_tokens} rows are "
                             f"decoded in one physical batch: start the server with "
                             f"--ubatch-size {span.chunk.n_tokens} or more", reason="kind")
    return prompt


def no_projector() -> MediaError:
    """The error for media sent to a model without a projector."""
    return MediaError("this model takes no images or audio (it was loaded without a "
                      "multimodal projector: --mmproj)", reason="no_projector")
