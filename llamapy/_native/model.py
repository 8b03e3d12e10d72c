"""``Model``: an owning wrapper of ``llama_model`` with its vocabulary and metadata."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InvalidOptionError, ModelLoadError, NativeError
from ..options.model import (
    LOAD_MODE_DIRECT_IO,
    LOAD_MODE_MLOCK,
    LOAD_MODE_MMAP,
    LOAD_MODE_MMAP_MLOCK,
    LOAD_MODE_NONE,
    SPLIT_MODES,
    ModelOptions,
    load_option_keys,
)
from . import _logging
from ._loader import c_bytes, c_text, native
from ._shim import WHAT_SIZE, check_error
from .devices import async_gpus, model_devices
from .owned import Owned, not_null

__all__ = ["LOAD_MODE_DIRECT_IO", "LOAD_MODE_MLOCK", "LOAD_MODE_MMAP", "LOAD_MODE_MMAP_MLOCK",
           "LOAD_MODE_NONE", "LoraAdapter", "Model", "ModelOptions", "load_option_keys"]


class Model(Owned):
    """A loaded GGUF model. Thread-safe for read-only use (tokenize, metadata).

    Use as a context manager or call :meth:`close`; contexts made from the model must be
    closed first (``Context`` keeps its model alive and closing a model with live contexts
    defers the free until the last one closes).
    """

    KIND = "model"

    def __init__(self, path: str | os.PathLike[str], options: ModelOptions | None = None,
                 **kwargs: Any) -> None:
        if options is None:
            options = _model_options(kwargs)
        elif kwargs:
            raise InvalidOptionError("pass either options= or keyword options, not both")
        self.path = Path(path)
        self.options = options
        self._ptr: Any = None
        self._contexts = 0
        self._close_requested = False
        self._piece_cache: dict[tuple[int, bool], bytes] = {}
        self._eog: tuple[int, ...] | None = None
        self._is_eog: dict[int, bool] = {}
        self._eog_lock = threading.Lock()
        self._ptr = self._load(options)
        nat = native()
        self._vocab = nat.lib.llama_model_get_vocab(self._ptr)
        self.n_vocab: int = nat.lib.llama_vocab_n_tokens(self._vocab)

    def _load(self, options: ModelOptions) -> Any:
        if not self.path.is_file():
            raise ModelLoadError(f"model file not found: {self.path}")
        ffi, lib = native().ffi, native().lib
        params = lib.llama_model_default_params()
        params.n_gpu_layers = options.n_gpu_layers
        params.main_gpu = options.main_gpu
        params.load_mode = options.load_mode
        params.check_tensors = options.check_tensors
        params.vocab_only = options.vocab_only
        params.split_mode = SPLIT_MODES[options.split_mode]
        keep = None
        # libllama copies the device list while loading; ``devices`` keeps it alive till then.
        devices = model_devices(options.rpc_servers) if options.rpc_servers else None
        if devices is not None:
            params.devices = devices
        if options.tensor_split:
            keep = ffi.new("float[]", max(len(options.tensor_split), lib.llama_max_devices()))
            for i, v in enumerate(options.tensor_split):
                keep[i] = v
            params.tensor_split = keep
        with _logging.loud_call() as lines:
            ptr = lib.llama_model_load_from_file(str(self.path).encode(), params)
        return not_null(ptr, lambda: ModelLoadError(
            f"failed to load model {self.path}: " + _logging.captured_message(
                lines, "llama_model_load_from_file returned NULL")))

    @property
    def computes_async(self) -> bool:
        """Whether a decode on this model only queues its step: its layers are offloaded and a
        local GPU computes asynchronously (the outputs are waited for when read)."""
        return self.options.n_gpu_layers != 0 and not self.options.vocab_only and async_gpus()

    # --- lifetime -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the free may wait for the last context)."""
        return self._ptr is None or self._close_requested

    @property
    def vocab(self) -> Any:
        """The raw ``const llama_vocab *``."""
        self.ptr  # noqa: B018 - raises when closed
        return self._vocab

    def _retain(self) -> None:
        self.ptr  # noqa: B018
        self._contexts += 1

    def _release(self) -> None:
        self._contexts -= 1
        if self._close_requested and self._contexts == 0:
            super().close()

    def close(self) -> None:
        """Free the model (deferred until its last context closes). Idempotent."""
        if self._ptr is None:
            return
        self._close_requested = True
        if self._contexts == 0:
            super().close()

    def _free(self, ptr: Any) -> None:
        native().lib.llama_model_free(ptr)

    # --- metadata -----------------------------------------------------------------------------

    def _string(self, fn: Any, *args: Any) -> str:
        ffi = native().ffi
        size = 256
        while True:
            buf = ffi.new("char[]", size)
            n = fn(*args, buf, size)
            if n < 0:
                return ""
            if n < size:
                return c_text(buf, n)
            size = n + 1

    def metadata(self) -> dict[str, str]:
        """All GGUF key/value pairs (values as strings, arrays omitted by llama.cpp)."""
        lib = native().lib
        ptr = self.ptr
        out = {}
        for i in range(lib.llama_model_meta_count(ptr)):
            key = self._string(lib.llama_model_meta_key_by_index, ptr, i)
            out[key] = self._string(lib.llama_model_meta_val_str_by_index, ptr, i)
        return out

    def meta(self, key: str) -> str | None:
        """One GGUF metadata value, or ``None``."""
        lib = native().lib
        ffi = native().ffi
        buf = ffi.new("char[]", 4096)
        n = lib.llama_model_meta_val_str(self.ptr, key.encode(), buf, 4096)
        if n < 0:
            return None
        if n >= 4096:
            return self._string(lib.llama_model_meta_val_str, self.ptr, key.encode())
        return c_text(buf, n)

    @property
    def description(self) -> str:
        """llama.cpp's one-line description (architecture, size, quantization)."""
        return self._string(native().lib.llama_model_desc, self.ptr)

    @property
    def size(self) -> int:
        """Total bytes of the model's tensors."""
        return int(native().lib.llama_model_size(self.ptr))

    @property
    def n_params(self) -> int:
        """Number of parameters."""
        return int(native().lib.llama_model_n_params(self.ptr))

    @property
    def n_ctx_train(self) -> int:
        """Context length the model was trained with."""
        return int(native().lib.llama_model_n_ctx_train(self.ptr))

    @property
    def n_embd(self) -> int:
        """Embedding width."""
        return int(native().lib.llama_model_n_embd(self.ptr))

    @property
    def n_embd_inp(self) -> int:
        """Width of an input embedding (what a multimodal projector outputs per row)."""
        return int(native().lib.llama_model_n_embd_inp(self.ptr))

    @property
    def is_recurrent(self) -> bool:
        """Recurrent models (and hybrids) cannot remove partial sequences."""
        lib = native().lib
        return bool(lib.llama_model_is_recurrent(self.ptr) or lib.llama_model_is_hybrid(self.ptr))

    @property
    def n_swa(self) -> int:
        """The sliding-window attention layers' window (0: none)."""
        return int(native().lib.llama_model_n_swa(self.ptr))

    def chat_template(self, name: str | None = None) -> str | None:
        """The GGUF ``tokenizer.chat_template`` (or a named one), or ``None``."""
        ffi, lib = native().ffi, native().lib
        ptr = lib.llama_model_chat_template(self.ptr, name.encode() if name else ffi.NULL)
        return None if ptr == ffi.NULL else ffi.string(ptr).decode("utf-8", "replace")

    # --- vocabulary ---------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False
                 ) -> list[int]:
        """Text to token ids (``add_special`` adds BOS/EOS as the model wants)."""
        ffi, shim = native().ffi, native().shim
        data = text.encode("utf-8")
        cap = len(data) + 8
        out, what = ffi.new("int32_t *"), ffi.new("char[]", WHAT_SIZE)
        for _ in range(2):
            buf = ffi.new("llama_token[]", cap)
            status = shim.llamapy_tokenize(self.vocab, data, len(data), buf, cap, add_special,
                                           parse_special, out, what, WHAT_SIZE)
            check_error(status, what, "llama_tokenize")
            n = out[0]
            if n >= 0:
                return list(ffi.unpack(buf, n))
            if n == -(2**31):
                raise NativeError("tokenization overflow")
            cap = -n
        raise NativeError("tokenization failed")

    def token_to_piece(self, token: int, special: bool = True) -> bytes:
        """The bytes of one token (special tokens rendered when ``special``);
        :class:`~llamapy.errors.InvalidOptionError` for an id outside the vocabulary
        (libllama would read out of bounds)."""
        cached = self._piece_cache.get((token, special))
        if cached is not None:
            return cached
        self._check_ids((token,))
        ffi, lib = native().ffi, native().lib
        buf = ffi.new("char[]", 64)
        n = lib.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ffi.new("char[]", -n)
            n = lib.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        piece = c_bytes(buf, n)
        self._piece_cache[(token, special)] = piece
        return piece

    def detokenize(self, tokens: Sequence[int], remove_special: bool = False,
                   unparse_special: bool = False) -> str:
        """Token ids to text (:class:`~llamapy.errors.InvalidOptionError` for an id outside
        the vocabulary)."""
        tokens = list(tokens)
        self._check_ids(tokens)
        ffi, lib = native().ffi, native().lib
        arr = ffi.new("llama_token[]", tokens)
        cap = max(16, len(tokens) * 8)
        for _ in range(2):
            buf = ffi.new("char[]", cap)
            n = lib.llama_detokenize(self.vocab, arr, len(tokens), buf, cap, remove_special,
                                     unparse_special)
            if n >= 0:
                return c_bytes(buf, n).decode("utf-8", "replace")
            cap = -n
        raise NativeError("detokenization failed")

    def _check_ids(self, tokens: Sequence[int]) -> None:
        if tokens and not 0 <= min(tokens) <= max(tokens) < self.n_vocab:
            raise InvalidOptionError(f"token ids must be in [0, {self.n_vocab})",
                                     option="tokens")

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation (EOS, EOT, ...); cached per token, as the engine
        asks for every generated token (a native call releases the GIL to other threads)."""
        known = self._is_eog.get(token)
        if known is None:
            known = self._is_eog[token] = bool(native().lib.llama_vocab_is_eog(self.vocab, token))
        return known

    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token, in id order (one scan of the vocabulary, cached;
        concurrent first callers wait for one scan)."""
        with self._eog_lock:
            if self._eog is None:
                is_eog, vocab = native().lib.llama_vocab_is_eog, self.vocab
                self._eog = tuple(t for t in range(self.n_vocab) if is_eog(vocab, t))
            return self._eog

    @property
    def bos(self) -> int:
        """Beginning-of-sequence token (-1 if none)."""
        return int(native().lib.llama_vocab_bos(self.vocab))

    @property
    def eos(self) -> int:
        """End-of-sequence token (-1 if none)."""
        return int(native().lib.llama_vocab_eos(self.vocab))

    @property
    def eot(self) -> int:
        """End-of-turn token (-1 if none)."""
        return int(native().lib.llama_vocab_eot(self.vocab))

    @property
    def fim_tokens(self) -> dict[str, int]:
        """Fill-in-the-middle tokens by role (``pre``, ``suf``, ``mid``, ``pad``, ``rep``,
        ``sep``; -1 when the vocabulary has none)."""
        lib = native().lib
        return {role: int(getattr(lib, f"llama_vocab_fim_{role}")(self.vocab))
                for role in ("pre", "suf", "mid", "pad", "rep", "sep")}

    @property
    def add_bos(self) -> bool:
        """Whether tokenization with ``add_special`` prepends BOS."""
        return bool(native().lib.llama_vocab_get_add_bos(self.vocab))

    @property
    def add_eos(self) -> bool:
        """Whether tokenization with ``add_special`` appends EOS."""
        return bool(native().lib.llama_vocab_get_add_eos(self.vocab))

    @property
    def add_sep(self) -> bool:
        """Whether the vocabulary separates two texts with SEP (BERT-style pairs)."""
        return bool(native().lib.llama_vocab_get_add_sep(self.vocab))

    @property
    def sep(self) -> int:
        """Separator token (-1 if none)."""
        return int(native().lib.llama_vocab_sep(self.vocab))

    @property
    def n_cls_out(self) -> int:
        """Outputs of the classifier head (a reranker's score: 1; llama.cpp also reports 1 for
        a model that declares no labels)."""
        return int(native().lib.llama_model_n_cls_out(self.ptr))

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text for a token."""
        return c_text(native().lib.llama_vocab_get_text(self.vocab, token))

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.description
        return f"<Model {self.path.name} {state}>"


def _model_options(kwargs: dict[str, Any]) -> ModelOptions:
    from ..errors import UnknownOptionError

    unknown = set(kwargs) - set(load_option_keys())
    if unknown:
        raise UnknownOptionError(unknown, load_option_keys(), where="model load")
    return ModelOptions(**kwargs)


class LoraAdapter(Owned):
    """A LoRA adapter loaded for a model (valid while the model lives)."""

    KIND = "LoRA adapter"
    FREE_ON_GC = False  # a context may still use it; the model frees its adapters itself

    def __init__(self, model: Model, path: str | os.PathLike[str]) -> None:
        self.model = model
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelLoadError(f"LoRA adapter not found: {self.path}")
        lib = native().lib
        with _logging.capture() as lines:
            ptr = lib.llama_adapter_lora_init(model.ptr, str(self.path).encode())
        self._ptr: Any = not_null(ptr, lambda: ModelLoadError(
            f"failed to load LoRA adapter {self.path}: " + _logging.captured_message(
                lines, "llama_adapter_lora_init returned NULL")))

    def _free(self, ptr: Any) -> None:
        """Free the adapter, unless its model is gone (the model freed it)."""
        if not self.model.closed:
            native().lib.llama_adapter_lora_free(ptr)
