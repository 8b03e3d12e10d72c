"""``FakeMediaEncoder``: :class:`~llamapy.media.MediaEncoder`'s interface for servers on the
fake backend. Media is checked exactly as the real encoder checks it (:func:`.probe.probe` and
the request's limits), then "encoded" by
:func:`~llamapy.engine.fake.media.fake_media_chunk`; text between markers is tokenized by the
fake model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llamapy.engine.fake.media import fake_media_chunk
from llamapy.engine.media import MediaPrompt, MediaSpan
from llamapy.errors import MediaError
from llamapy.options.limits import RequestLimits

from .encoder import check_media_items

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
               add_special: bool = True, parse_special: bool = True) -> MediaPrompt:
        """See :meth:`MediaEncoder.prompt`."""
        infos = check_media_items(media, limits, self.modalities)
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
        return MediaPrompt(token_ids, spans)
