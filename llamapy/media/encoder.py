"""``MediaEncoder``: a model's multimodal projector, shared by every request of a server.

:meth:`MediaEncoder.prompt` turns a prompt text with media markers and the media's bytes into a
:class:`~llamapy.engine.media.MediaPrompt`: text tokens, and for each image or audio clip its
embeddings, placed where its marker was. Every item is checked first (:func:`.probe.probe`:
its kind and format from its header, an image's pixel count before it is decoded; the
request's limits; what the projector takes). Encoding runs on the caller's thread (an HTTP
worker thread, never the event loop or the tick thread), one step at a time: the projector is
not thread-safe. Whose step comes next, round robin over tenants, and the bytes of media that
may wait for it, overall and per tenant, are the :class:`~.queue.EncoderQueue`'s.

A media chunk is named by the sha256 of the projector's identity and the item's bytes, so
identical media has identical media token ids (the engine's caches reuse its KV) and one
projector never answers for another's. Encoded chunks are kept in a byte-bounded LRU
(``cache_bytes``): a conversation that sends the same image each turn encodes it once.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llamapy._native import Model
from llamapy._native.mtmd import MediaChunks, Projector
from llamapy.engine.media import MediaChunk, MediaPrompt, MediaSpan
from llamapy.errors import ContextOverflowError, UnsupportedFeatureError
from llamapy.fingerprint import model_fingerprint
from llamapy.options.limits import RequestLimits

from .audio import wav_samples
from .checks import check_media_items
from .probe import MediaInfo
from .queue import EncoderQueue, Turn, decoded_bytes

__all__ = ["MediaEncoder"]

#: Encoded chunks kept for reuse, in bytes of embeddings.
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


class MediaEncoder:
    """A loaded projector behind its :class:`~.queue.EncoderQueue` (``queue``: its bounds),
    with an LRU of encoded chunks (see the module)."""

    def __init__(self, projector: Projector, identity: str, *,
                 cache_bytes: int = DEFAULT_CACHE_BYTES,
                 queue: EncoderQueue | None = None) -> None:
        if projector.uses_mrope:
            projector.close()
            raise UnsupportedFeatureError("mmproj", "this projector places media with M-RoPE "
                                          "(several positions a token); llamapy does not yet")
        self._projector = projector
        self.identity = identity
        self.marker = projector.marker
        self.vision = projector.supports_vision
        self.audio = projector.supports_audio
        self.queue = queue or EncoderQueue()
        self._lock = threading.Lock()  # (the queue's turns order the steps; close waits here)
        self._cache: OrderedDict[bytes, MediaChunk] = OrderedDict()
        self._cache_bytes = cache_bytes
        self._held = 0
        self.num_encoded = 0
        self.num_cache_hits = 0

    @classmethod
    def load(cls, path: str | Path, model: Model, *, use_gpu: bool = True,
             n_threads: int = 4) -> MediaEncoder:
        """Load the projector at ``path`` for ``model`` (``ModelLoadError`` if it does not
        fit the model)."""
        projector = Projector(path, model, use_gpu=use_gpu, n_threads=n_threads)
        return cls(projector, identity=model_fingerprint(path))

    @property
    def modalities(self) -> dict[str, bool]:
        """``{"vision": ..., "audio": ...}``: what the projector takes."""
        return {"vision": self.vision, "audio": self.audio}

    def close(self) -> None:
        """Free the projector (before its model). Idempotent."""
        with self._lock:
            self._projector.close()
            self._cache.clear()
            self._held = 0

    def check(self, media: Sequence[bytes], limits: RequestLimits) -> list[MediaInfo]:
        """See :func:`check_media_items`."""
        return check_media_items(media, limits, self.modalities)

    def prompt(self, text: str, media: Sequence[bytes], limits: RequestLimits, *,
               tenant: str | None = None, add_special: bool = True, parse_special: bool = True,
               max_tokens: int | None = None) -> MediaPrompt:
        """Tokenize ``text``, where each :attr:`marker` stands for the next item of ``media``,
        and encode the media (or take it from the cache), as a request of ``tenant`` (None:
        the default tenant) in the :attr:`queue`. :class:`~llamapy.errors.MediaError` for
        media refused by :meth:`check` or by the queue's bound on one tenant, undecodable, or
        not matching the markers; ``ContextOverflowError`` for a prompt of more than
        ``max_tokens``, before anything is encoded; :class:`~llamapy.errors.MediaBusyError`
        (:class:`~llamapy.errors.MediaMemoryError` for bytes) when the queue refuses it."""
        infos = self.check(media, limits)
        rate = self._projector.audio_sample_rate
        with self.queue.admit(tenant, decoded_bytes(media, infos, rate)) as held:
            audio = [wav_samples(data, rate, limits.max_media_seconds) if info.kind == "audio"
                     else None for data, info in zip(media, infos, strict=True)]
            digests = [self._digest(data) for data in media]
            with self.queue.turn(held) as turn:
                chunks = self._tokenize(text, media, audio, digests, add_special, parse_special)
                with chunks:
                    total = sum(info.n_tokens for info in chunks.items)
                    if max_tokens is not None and total > max_tokens:
                        raise ContextOverflowError(stage="admit", resident_tokens=0,
                                                   additional_tokens=total, n_ctx=max_tokens)
                    plan = self._plan(chunks)
                    held.grow(sum(chunks.items[i].n_tokens for i, digest in plan
                                  if digest not in self._cache) * self._projector.width * 4)
                    return self._assemble(chunks, plan, turn)

    def _tokenize(self, text: str, media: Sequence[bytes], audio: list[Any],
                  digests: list[bytes], add_special: bool, parse_special: bool) -> MediaChunks:
        """The chunks of ``text`` with its media, decoded for it (in the request's turn)."""
        bitmaps = []
        try:
            with self._lock:
                for data, samples, digest in zip(media, audio, digests, strict=True):
                    bitmap = (self._projector.bitmap(data) if samples is None
                              else self._projector.audio_bitmap(samples))
                    bitmaps.append(bitmap)
                    bitmap.set_id(digest.hex())
                return self._projector.tokenize(text, bitmaps, add_special=add_special,
                                                parse_special=parse_special)
        finally:
            for bitmap in bitmaps:
                bitmap.close()

    def _digest(self, data: bytes) -> bytes:
        return hashlib.sha256(f"llamapy-media\x00{self.identity}\x00".encode() + data).digest()

    def _plan(self, chunks: MediaChunks) -> list[tuple[int, bytes]]:
        """Each media chunk's index and digest (an item's bitmap name and its ordinal: the same
        media twice in a prompt is two chunks)."""
        plan: list[tuple[int, bytes]] = []
        seen: dict[str, int] = {}
        for index, info in enumerate(chunks.items):
            if info.kind == "text":
                continue
            if info.n_pos != info.n_tokens:
                raise UnsupportedFeatureError("mmproj", "this projector's media takes positions "
                                              "of its own; llamapy does not decode it yet")
            ordinal = seen[info.id] = seen.get(info.id, -1) + 1
            plan.append((index, hashlib.sha256(f"{info.id}:{ordinal}".encode()).digest()))
        return plan

    def _assemble(self, chunks: MediaChunks, plan: list[tuple[int, bytes]],
                  turn: Turn) -> MediaPrompt:
        """The prompt of ``chunks``: text tokens, and each media chunk's (cached) encoding,
        one step of ``turn`` for each chunk encoded (the first in the tokenizing step)."""
        digests = dict(plan)
        token_ids: list[int] = []
        spans: list[MediaSpan] = []
        steps = 0
        for index, info in enumerate(chunks.items):
            if info.kind == "text":
                token_ids.extend(info.token_ids)
                continue
            digest = digests[index]
            chunk = self._cached(digest)
            if chunk is None:
                if steps:
                    turn.next()
                steps += 1
                chunk = self._encode(chunks, index, digest)
            spans.append(MediaSpan(len(token_ids), chunk))
            token_ids.extend(chunk.token_ids)
        return MediaPrompt(token_ids, spans)

    def _cached(self, digest: bytes) -> MediaChunk | None:
        chunk = self._cache.get(digest)
        if chunk is not None:
            self._cache.move_to_end(digest)
            self.num_cache_hits += 1
        return chunk

    def _encode(self, chunks: MediaChunks, index: int, digest: bytes) -> MediaChunk:
        info = chunks.items[index]
        with self._lock:
            embeddings = chunks.encode(index)
        chunk = MediaChunk(digest, embeddings, info.n_tokens, self._projector.width,
                           info.kind, causal=not info.non_causal)
        self.num_encoded += 1
        self._cache[digest] = chunk
        self._held += len(chunk.embeddings)
        while self._held > self._cache_bytes and self._cache:
            _, old = self._cache.popitem(last=False)
            self._held -= len(old.embeddings)
        return chunk
