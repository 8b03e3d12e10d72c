"""``FakeMediaEncoder``: :class:`~llamapy.media.encoder.MediaEncoder`'s interface for servers on the
fake backend. Media is checked exactly as the real encoder checks it (:func:`.probe.probe` and
the request's limits), waits in an :class:`~.queue.EncoderQueue` exactly as the real encoder's
requests do (the bytes its media decodes to, then its embeddings; one step an item, tenants in
turn), then is "encoded" by :func:`~llamapy.engine.fake.media.fake_media_chunk`; text between
markers is tokenized by the fake model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llamapy.engine.fake.media import FAKE_MEDIA_WIDTH, fake_media_chunk, fake_media_tokens
from llamapy.engine.media import MediaChunk, MediaPrompt, MediaSpan
from llamapy.errors import ContextOverflowError, MediaError
from llamapy.options.limits import RequestLimits

from .audio import wav_samples
from .checks import check_media_items
from .probe import MediaInfo
from .queue import EncoderQueue, Held, Turn, decoded_bytes

__all__ = ["FAKE_AUDIO_RATE", "FakeMediaEncoder"]

MARKER = "<__media__>"
#: The sample rate the fake projector takes audio at.
FAKE_AUDIO_RATE = 16000

#: Called in each encode step with the request's tenant and the item's index.
EncodeHook = Callable[[str | None, int], None]


class FakeMediaEncoder:
    """A projector for fake servers that takes images (and audio with ``audio=True``; its
    chunks must be decoded whole with ``causal=False``). ``queue``: its bounds;
    :attr:`on_encode`, when set, is called in each encode step (tests hold the projector with
    it)."""

    def __init__(self, tokenize: Callable[[str, bool, bool], list[int]], *,
                 audio: bool = False, causal: bool = True,
                 queue: EncoderQueue | None = None) -> None:
        self._tokenize = tokenize
        self._causal = causal
        self.marker = MARKER
        self.vision, self.audio = True, audio
        self.identity = "fake-projector"
        self.queue = queue or EncoderQueue()
        self.on_encode: EncodeHook | None = None
        self.num_encoded = 0
        self.num_cache_hits = 0

    @property
    def modalities(self) -> dict[str, bool]:
        """``{"vision": True, "audio": ...}``."""
        return {"vision": self.vision, "audio": self.audio}

    def close(self) -> None:
        """Nothing to free."""

    def prompt(self, text: str, media: Sequence[bytes], limits: RequestLimits, *,
               tenant: str | None = None, add_special: bool = True, parse_special: bool = True,
               max_tokens: int | None = None) -> MediaPrompt:
        """See :meth:`MediaEncoder.prompt` (audio is read as the real encoder reads it)."""
        infos = check_media_items(media, limits, self.modalities)
        with self.queue.admit(tenant, decoded_bytes(media, infos, FAKE_AUDIO_RATE)) as held:
            for data, info in zip(media, infos, strict=True):
                if info.kind == "audio":
                    wav_samples(data, FAKE_AUDIO_RATE, limits.max_media_seconds)
            with self.queue.turn(held) as turn:
                pieces = self._cut(text, media, add_special, parse_special)
                self._check_fits(pieces, media, max_tokens, held)
                return self._assemble(pieces, media, infos, turn)

    def _cut(self, text: str, media: Sequence[bytes], add_special: bool,
             parse_special: bool) -> list[list[int]]:
        """The text's tokens between the media markers (one list more than ``media``)."""
        pieces = text.split(self.marker)
        if len(pieces) != len(media) + 1:
            raise MediaError(f"the prompt has {len(pieces) - 1} media markers for "
                             f"{len(media)} media items", reason="placement")
        return [list(self._tokenize(piece, add_special and i == 0, parse_special))
                for i, piece in enumerate(pieces)]

    def _check_fits(self, pieces: list[list[int]], media: Sequence[bytes],
                    max_tokens: int | None, held: Held) -> None:
        """``ContextOverflowError`` past ``max_tokens``; then hold the embeddings' bytes."""
        rows = [fake_media_tokens(data) for data in media]
        total = sum(len(piece) for piece in pieces) + sum(rows)
        if max_tokens is not None and total > max_tokens:
            raise ContextOverflowError(stage="admit", resident_tokens=0,
                                       additional_tokens=total, n_ctx=max_tokens)
        held.grow(sum(rows) * FAKE_MEDIA_WIDTH * 4)

    def _assemble(self, pieces: list[list[int]], media: Sequence[bytes],
                  infos: list[MediaInfo], turn: Turn) -> MediaPrompt:
        """The prompt: each item encoded in a step of its own (the first in this one)."""
        token_ids = list(pieces[0])
        spans = []
        for index, (data, info, piece) in enumerate(zip(media, infos, pieces[1:],
                                                        strict=True)):
            if index:
                turn.next()
            chunk = self._encode(turn.tenant, index, data, info)
            spans.append(MediaSpan(len(token_ids), chunk))
            token_ids += chunk.token_ids
            token_ids += piece
        return MediaPrompt(token_ids, spans)

    def _encode(self, tenant: str | None, index: int, data: bytes,
                info: MediaInfo) -> MediaChunk:
        if self.on_encode is not None:
            self.on_encode(tenant, index)
        self.num_encoded += 1
        return fake_media_chunk(data, info.kind, self._causal)
