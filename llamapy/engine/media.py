"""Images and audio in a prompt: media chunks as the engine sees them.

A prompt with media is still a list of token ids: each media chunk (an image or audio clip,
already encoded into ``n_tokens`` embeddings by a model's projector) occupies ``n_tokens``
positions, held by *media token ids*: negative ids derived from the chunk's digest (a hash of
its bytes and of the projector) and the row's index (:func:`media_token_ids`). So everything
that reuses KV by comparing tokens (a slot's own prefix, donors, in-flight adoption, the RAM
and disk caches) reuses a media chunk's KV exactly when the same media comes again at the same
place, and never for other media: two digests give the same ids only if their first 60 bits
agree.

A :class:`~llamapy.engine.request.Request` carries its chunks as :class:`MediaSpan`: where in
the prompt each begins. The planner never mixes text and media in one slot's entry: a prefill
chunk ends where a media chunk begins, and a media chunk's rows are decoded (possibly over
several ticks, under the same ``n_batch`` budget as text) as a segment with
:class:`MediaRows`, which the backend decodes from the embeddings instead of token ids.

A chunk that is not ``causal`` (Gemma 3's images: their rows attend to one another both ways)
is decoded whole in one decode of its own, as llama-server does: its entry takes all its rows
whatever the tick's budget gave the slot (each decode stays within ``n_batch``: a longer such
chunk is refused at submit), and a reused prefix never ends inside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llamapy.errors import InvalidOptionError

__all__ = ["MEDIA_KINDS", "MediaChunk", "MediaPrompt", "MediaRows", "MediaSpan", "check_media",
           "is_media_token", "media_floor", "media_token_ids"]

#: The kinds of media a chunk may hold.
MEDIA_KINDS = frozenset({"image", "audio"})
_BASE_SHIFT = 4  # 64 - 4 = 60 bits of digest per chunk: ids stay within int64


def media_token_ids(digest: bytes, n_tokens: int) -> tuple[int, ...]:
    """The ``n_tokens`` ids standing for a media chunk with ``digest`` (all negative)."""
    base = int.from_bytes(digest[:8], "little") >> _BASE_SHIFT
    return tuple(-(1 + base + i) for i in range(n_tokens))


def is_media_token(token_id: int) -> bool:
    """Whether ``token_id`` stands for a row of a media chunk (text tokens are >= 0)."""
    return token_id < 0


@dataclass(frozen=True, slots=True, eq=False)
class MediaChunk:
    """One encoded image or audio clip: ``n_tokens`` embeddings of ``width`` float32 each
    (``embeddings``, row-major, native byte order), identified by ``digest``. ``causal``:
    whether its rows may be decoded a few at a time (see the module)."""

    digest: bytes
    embeddings: bytes
    n_tokens: int
    width: int
    kind: str = "image"
    causal: bool = True

    def __post_init__(self) -> None:
        if self.kind not in MEDIA_KINDS or self.n_tokens <= 0 or self.width <= 0 \
                or len(self.digest) < 8:
            raise InvalidOptionError("malformed media chunk", option="media")
        if len(self.embeddings) != self.n_tokens * self.width * 4:
            raise InvalidOptionError(
                f"media chunk: {len(self.embeddings)} bytes of embeddings, expected "
                f"{self.n_tokens} x {self.width} float32", option="media")

    @property
    def token_ids(self) -> tuple[int, ...]:
        """Its media token ids (see :func:`media_token_ids`)."""
        return media_token_ids(self.digest, self.n_tokens)

    def rows(self, first: int, n: int) -> memoryview:
        """The embeddings of rows ``first .. first + n - 1``."""
        size = self.width * 4
        return memoryview(self.embeddings)[first * size:(first + n) * size]


@dataclass(frozen=True, slots=True)
class MediaSpan:
    """A media chunk placed in a prompt from index ``start``."""

    start: int
    chunk: MediaChunk

    @property
    def end(self) -> int:
        """The index just past its last row."""
        return self.start + self.chunk.n_tokens


class MediaPrompt(tuple[int, ...]):
    """A prompt's token ids (a tuple, media token ids included) that carries its
    :class:`MediaSpan` as ``media``: what a projector's tokenizer returns, and what a caller
    passes wherever token ids go. A slice or copy is a plain tuple without the media (whose
    ids the engine then refuses). ``checkpoint_hints`` go to the request as its
    :attr:`~llamapy.engine.request.Request.checkpoint_hints` (where a chat's next turn is
    expected to diverge)."""

    media: tuple[MediaSpan, ...]
    checkpoint_hints: tuple[int, ...]

    def __new__(cls, token_ids: Sequence[int], media: Sequence[MediaSpan] = (),
                checkpoint_hints: Sequence[int] = ()) -> MediaPrompt:
        prompt = super().__new__(cls, token_ids)
        prompt.media = tuple(media)
        prompt.checkpoint_hints = tuple(checkpoint_hints)
        return prompt

    @property
    def num_media_tokens(self) -> int:
        """Positions held by media."""
        return sum(span.chunk.n_tokens for span in self.media)


@dataclass(frozen=True, slots=True)
class MediaRows:
    """What a media segment decodes: ``chunk``'s rows from ``first`` (as many as the segment
    has tokens)."""

    chunk: MediaChunk
    first: int


def check_media(prompt: Sequence[int], spans: Sequence[MediaSpan], n_vocab: int,
                samples: bool, n_batch: int, held: int = 0, width: int | None = None) -> None:
    """``InvalidOptionError`` unless every negative id of ``prompt`` belongs to one of
    ``spans`` (sorted, disjoint, each holding its chunk's ids, rows ``width`` wide; one that is
    not causal within ``n_batch`` rows, the smaller of the decode's and a physical batch's) or
    to its first ``held`` ids (KV a leased slot already holds: they are not decoded again),
    every other id is in ``[0, n_vocab)``, and (when the request samples) the prompt ends with
    text."""
    at = held if not spans else 0
    for span in spans:
        if not isinstance(span, MediaSpan) or span.start < at or span.end > len(prompt):
            raise InvalidOptionError("media spans must be sorted, disjoint and inside the "
                                     "prompt", option="media")
        if width is not None and span.chunk.width != width:
            raise InvalidOptionError(f"a media chunk's rows are {span.chunk.width} wide, this "
                                     f"model's {width}", option="media")
        if not span.chunk.causal and span.chunk.n_tokens > n_batch:
            raise InvalidOptionError(
                f"a media chunk of {span.chunk.n_tokens} rows is decoded in one batch: raise "
                f"n_batch (now {n_batch}) to at least that", option="n_batch")
        if tuple(prompt[span.start:span.end]) != span.chunk.token_ids:
            raise InvalidOptionError("a media span's token ids are not its chunk's",
                                     option="media")
        _check_text(prompt[max(at, held):span.start], n_vocab)
        at = span.end
    _check_text(prompt[max(at, held):], n_vocab)
    if samples and prompt and prompt[-1] < 0:
        raise InvalidOptionError("a prompt must end with text after its last media chunk",
                                 option="media")


def media_floor(spans: Sequence[MediaSpan], n: int) -> int:
    """``n`` reused positions, cut back to the start of a chunk that is not causal when they
    end inside it (its rows are decoded together or not at all)."""
    for span in spans:
        if span.start < n < span.end and not span.chunk.causal:
            return span.start
        if span.start >= n:
            break
    return n


def _check_text(token_ids: Sequence[int], n_vocab: int) -> None:
    if token_ids and (min(token_ids) < 0 or max(token_ids) >= n_vocab):
        raise InvalidOptionError(f"token ids must be in [0, {n_vocab})", option="token_ids")
