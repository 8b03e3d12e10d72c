"""``FakeMediaEncoder``: :class:`~llamapy.media.encoder.MediaEncoder`'s interface for servers on the
fake backend. Media is checked exactly as the real encoder checks it (:func:`.probe.probe` and
the request's limits), then "encoded" by
:func:`~llamapy.engine.fake.media.fake_media_chunk`; text between markers is tokenized by the
fake model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llamapy.engine.fake.media import fake_media_chunk
from llamapy.engine.media import MediaPrompt, MediaSpan
from llamapy.errors import ContextOverflowError, MediaError
from llamapy.options.limits import RequestLimits

from .audio import wav_samples
from .checks import check_media_items

__all__ = ["FakeMediaEncoder"]

MARKER = "<__media__>"


class FakeMediaEncoder:
    """A projector for fake servers that takes images (and audio with ``audio=True``; its
    chunks must be decoded whole with ``causal=False``)."""

    def __init__(self, tokenize: Callable[[str, bool, bool], list[int]], *,
                 audio: bool = False, causal: bool = True) -> None:
        self._tokenize = tokenize
        self._causal = causal
        self.marker = MARKER
        self.vision, self.audio = True, audio
        self.identity = "fake-projector"
        self.num_encoded = 0
        self.num_cache_hits = 0

    @property
    def modalities(self) -> dict[str, bool]:
        """``{"vision": True, "audio": ...}``."""
        return {"vision": self.vision, "audio": self.audio}

    def close(self) -> None:
        """Nothing to free."""

    def prompt(self, text: str, media: Sequence[bytes], limits: RequestLimits, *,
               add_special: bool = True, parse_special: bool = True,
               max_tokens: int | None = None) -> MediaPrompt:
        """See :meth:`MediaEncoder.prompt` (audio is read as the real encoder reads it)."""
        infos = check_media_items(media, limits, self.modalities)
        for data, info in zip(media, infos, strict=True):
            if info.kind == "audio":
                wav_samples(data, 16000, limits.max_media_seconds)
        pieces = text.split(self.marker)
        if len(pieces) != len(media) + 1:
            raise MediaError(f"the prompt has {len(pieces) - 1} media markers for "
                             f"{len(media)} media items", reason="placement")
        token_ids = list(self._tokenize(pieces[0], add_special, parse_special))
        spans = []
        for data, info, piece in zip(media, infos, pieces[1:], strict=True):
            chunk = fake_media_chunk(data, info.kind, self._causal)
            self.num_encoded += 1
            spans.append(MediaSpan(len(token_ids), chunk))
            token_ids += chunk.token_ids
            token_ids += self._tokenize(piece, False, parse_special)
        if max_tokens is not None and len(token_ids) > max_tokens:
            raise ContextOverflowError(stage="admit", resident_tokens=0,
                                       additional_tokens=len(token_ids), n_ctx=max_tokens)
        return MediaPrompt(token_ids, spans)
