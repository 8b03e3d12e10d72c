"""``Projector`` (an owning ``mtmd_context``: a model's multimodal projector, its ``--mmproj``),
``Bitmap`` (an image or audio clip decoded by libmtmd) and ``MediaChunks`` (a prompt cut into
text and media chunks by ``mtmd_tokenize``).

libmtmd is opened on first use (:func:`~llamapy._native._loader.media_lib`). None of these is
thread-safe: one owner at a time calls them. No policy: which media a request may send, how
large, and what is cached are decided above.

The projector's compute (its warm-up at load, each encode) runs on a thread of its own that
ends with it (:func:`_on_own_thread`), whatever thread asks: ggml's CPU backend, built with
OpenMP, runs a graph in an OpenMP team of the calling thread, and libgomp keeps that team's
worker threads for as long as the calling thread lives. While it keeps more threads than the
machine has CPUs, each of its barriers sleeps instead of spinning: a long-lived HTTP worker
thread that encoded one image left every later decode (hundreds of barriers a token) 1.5 times
slower on two idle cores, more on a busy machine. A thread that ends takes its team with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import MediaError, ModelLoadError, NativeError
from . import _logging
from ._loader import c_bytes, c_text, media_lib, native
from .model import Model
from .owned import Owned, not_null

__all__ = ["Bitmap", "ChunkInfo", "MediaChunks", "Projector"]

#: ``enum mtmd_input_chunk_type``.
CHUNK_KINDS = {0: "text", 1: "image", 2: "audio"}

_T = TypeVar("_T")


def _on_own_thread(call: Callable[[], _T]) -> _T:
    """``call()`` on a new thread, joined: its result, or its exception raised here. The
    thread's OpenMP workers end with it (see the module)."""
    results: list[_T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(call())
        except BaseException as exc:  # raised again on the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="llamapy-mtmd", daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


class Projector(Owned):
    """A multimodal projector (mmproj GGUF) loaded for ``model``: it turns images (and, for
    audio projectors, sound) into embeddings of the model's input width.

    ``use_gpu`` offloads the projector (llama-server's ``--mmproj-offload``); ``n_threads`` its
    CPU threads. Close it before its model.
    """

    KIND = "multimodal projector"

    def __init__(self, path: str | Path, model: Model, *, use_gpu: bool = True,
                 n_threads: int = 4, warmup: bool = True) -> None:
        self.path = Path(path)
        self.model = model
        lib = media_lib()
        params = lib.mtmd_context_params_default()
        params.use_gpu = bool(use_gpu)
        params.n_threads = int(n_threads)
        params.warmup = bool(warmup)
        params.print_timings = False

        def init() -> tuple[Any, list[str]]:
            with _logging.loud_call() as lines:
                return lib.mtmd_init_from_file(str(self.path).encode(), model.ptr, params), lines

        ptr, lines = _on_own_thread(init)  # (its warm-up computes)
        self._ptr = not_null(ptr, lambda: ModelLoadError(
            f"failed to load the multimodal projector {self.path}: "
            + _logging.captured_message(lines, "libmtmd returned no context")))
        self.marker = c_text(lib.mtmd_default_marker())
        self.width = model.n_embd_inp

    def _free(self, ptr: Any) -> None:
        media_lib().mtmd_free(ptr)

    @property
    def supports_vision(self) -> bool:
        """Whether the projector takes images."""
        return bool(media_lib().mtmd_support_vision(self.ptr))

    @property
    def supports_audio(self) -> bool:
        """Whether the projector takes audio."""
        return bool(media_lib().mtmd_support_audio(self.ptr))

    @property
    def audio_sample_rate(self) -> int:
        """The sample rate audio is resampled to (-1 without audio support)."""
        return int(media_lib().mtmd_get_audio_sample_rate(self.ptr))

    @property
    def uses_mrope(self) -> bool:
        """Whether media positions are M-RoPE's (several per token, Qwen2-VL's kind)."""
        return bool(media_lib().mtmd_decode_use_mrope(self.ptr))

    def bitmap(self, data: bytes) -> Bitmap:
        """Decode an image (PNG, JPEG, ... as stb_image reads them) from ``data`` (audio:
        :meth:`audio_bitmap`, from samples read in Python: libmtmd's reader trusts a file's
        header for its buffer's size). :class:`~llamapy.errors.MediaError` when it is not."""
        lib, ffi = media_lib(), native().ffi
        opt = lib.mtmd_helper_init_opt_default()
        buf = ffi.from_buffer("unsigned char[]", data)
        with _logging.capture() as lines:
            wrapper = lib.mtmd_helper_bitmap_init_from_buf(self.ptr, buf, len(data), False, opt)
        if wrapper.video_ctx != ffi.NULL:
            lib.mtmd_helper_video_free(wrapper.video_ctx)
            if wrapper.bitmap != ffi.NULL:
                lib.mtmd_bitmap_free(wrapper.bitmap)
            raise MediaError("video input is not supported", reason="kind")
        if wrapper.bitmap == ffi.NULL:
            raise MediaError("the media could not be decoded: " + _logging.captured_message(
                lines, "not an image or audio file libmtmd reads"), reason="decode")
        return Bitmap(wrapper.bitmap)

    def audio_bitmap(self, samples: Any) -> Bitmap:
        """A bitmap of mono float32 ``samples`` (a numpy array) at
        :attr:`audio_sample_rate`."""
        import numpy as np

        ffi = native().ffi
        data = np.ascontiguousarray(samples, dtype=np.float32)
        if data.ndim != 1 or len(data) < 2:
            raise MediaError("audio: expected at least two mono samples", reason="format")
        ptr = media_lib().mtmd_bitmap_init_from_audio(
            len(data), ffi.cast("const float *", ffi.from_buffer(data)))
        return Bitmap(not_null(ptr, lambda: MediaError("audio: no bitmap", reason="decode")))

    def tokenize(self, text: str, bitmaps: Sequence[Bitmap], *, add_special: bool = True,
                 parse_special: bool = True) -> MediaChunks:
        """Cut ``text`` into text and media chunks: each :attr:`marker` in it stands for the
        next of ``bitmaps``. A marker count other than ``len(bitmaps)`` is a
        :class:`~llamapy.errors.MediaError`."""
        lib, ffi = media_lib(), native().ffi
        raw = text.encode()
        c_text_buf = ffi.new("char[]", raw)
        inp = ffi.new("struct mtmd_input_text *")
        inp.text, inp.text_len = c_text_buf, len(raw)
        inp.add_special, inp.parse_special = add_special, parse_special
        ptrs = ffi.new("mtmd_bitmap *[]", [b.ptr for b in bitmaps] or [ffi.NULL])
        chunks = lib.mtmd_input_chunks_init()
        with _logging.capture() as lines:
            status = lib.mtmd_tokenize(self.ptr, chunks, inp, ptrs, len(bitmaps))
        if status != 0:
            lib.mtmd_input_chunks_free(chunks)
            what = {1: "the prompt's media markers do not match the media sent",
                    2: "the media could not be preprocessed"}.get(int(status), "tokenize failed")
            raise MediaError(_logging.captured_message(lines, what),
                             reason="placement" if status == 1 else "decode")
        return MediaChunks(chunks, self)


class Bitmap(Owned):
    """A decoded image (RGB) or audio clip (float samples), owned until :meth:`close`."""

    KIND = "media bitmap"

    def __init__(self, ptr: Any) -> None:
        self._ptr = ptr

    def _free(self, ptr: Any) -> None:
        media_lib().mtmd_bitmap_free(ptr)

    @property
    def is_audio(self) -> bool:
        """Whether it holds audio."""
        return bool(media_lib().mtmd_bitmap_is_audio(self.ptr))

    def set_id(self, value: str) -> None:
        """Name the bitmap: the chunks made of it carry the name (:attr:`ChunkInfo.id`)."""
        media_lib().mtmd_bitmap_set_id(self.ptr, value.encode())

    @property
    def size(self) -> tuple[int, int]:
        """``(width, height)`` in pixels (audio: samples and 1)."""
        lib = media_lib()
        return int(lib.mtmd_bitmap_get_nx(self.ptr)), int(lib.mtmd_bitmap_get_ny(self.ptr))


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """One chunk of a tokenized prompt: ``kind`` is ``"text"``, ``"image"`` or ``"audio"``;
    ``token_ids`` are a text chunk's tokens (empty for media); ``n_tokens`` the embeddings (or
    tokens) it decodes to and ``n_pos`` the positions it takes; ``non_causal`` whether its
    embeddings must be decoded in one batch with bidirectional attention; ``id`` a media
    chunk's bitmap's name (:meth:`Bitmap.set_id`)."""

    kind: str
    token_ids: tuple[int, ...]
    n_tokens: int
    n_pos: int
    non_causal: bool
    id: str = ""


class MediaChunks(Owned):
    """``mtmd_input_chunks``: a prompt's chunks, owned until :meth:`close`."""

    KIND = "media chunks"

    def __init__(self, ptr: Any, projector: Projector) -> None:
        self._ptr = ptr
        self._projector = projector
        self.items = [self._info(i) for i in range(int(media_lib().mtmd_input_chunks_size(ptr)))]

    def _free(self, ptr: Any) -> None:
        media_lib().mtmd_input_chunks_free(ptr)

    def _chunk(self, index: int) -> Any:
        return media_lib().mtmd_input_chunks_get(self.ptr, index)

    def _info(self, index: int) -> ChunkInfo:
        lib, ffi = media_lib(), native().ffi
        chunk = self._chunk(index)
        kind = CHUNK_KINDS.get(int(lib.mtmd_input_chunk_get_type(chunk)), "unknown")
        tokens: tuple[int, ...] = ()
        if kind == "text":
            n = ffi.new("size_t *")
            ptr = lib.mtmd_input_chunk_get_tokens_text(chunk, n)
            tokens = tuple(ffi.unpack(ptr, int(n[0]))) if n[0] else ()
        media = kind != "text"
        non_causal = media and bool(lib.mtmd_decode_use_non_causal(self._projector.ptr, chunk))
        name = lib.mtmd_input_chunk_get_id(chunk) if media else ffi.NULL
        return ChunkInfo(kind, tokens, int(lib.mtmd_input_chunk_get_n_tokens(chunk)),
                         int(lib.mtmd_input_chunk_get_n_pos(chunk)), non_causal,
                         c_text(name) if name != ffi.NULL else "")

    def encode(self, index: int) -> bytes:
        """Run the projector on media chunk ``index``: its embeddings, ``n_tokens`` rows of
        the model's input width, as float32 bytes."""
        info = self.items[index]
        if info.kind == "text":
            raise ValueError(f"chunk {index} is text")
        lib, ptr, chunk = media_lib(), self._projector.ptr, self._chunk(index)

        def encode() -> tuple[int, list[str]]:
            with _logging.capture() as lines:
                return int(lib.mtmd_encode_chunk(ptr, chunk)), lines

        status, lines = _on_own_thread(encode)
        if status != 0:
            raise NativeError("encoding the media failed: "
                              + _logging.captured_message(lines, f"status {status}"))
        n = info.n_tokens * self._projector.width * 4
        return c_bytes(lib.mtmd_get_output_embd(self._projector.ptr), n)
