"""``Context`` (an owning ``llama_context`` wrapper) and ``Batch`` (a reusable ``llama_batch``).

The options are :class:`~llamapy.options.ContextOptions` (defined in the option tree); this
module only maps them to ``llama_context_params``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._system import physical_cores
from ..errors import InvalidOptionError, NativeError, UnknownOptionError, decode_error
from ..options.context import (
    SERVER_OWNED_KEYS,
    ContextOptions,
    context_option_keys,
    tuning_option_keys,
)
from . import _logging
from ._loader import c_bytes, native
from ._shim import WHAT_SIZE, check_error
from .model import LoraAdapter, Model
from .owned import Owned, not_null

if TYPE_CHECKING:
    import numpy as np

__all__ = ["SERVER_OWNED_KEYS", "Batch", "Context", "ContextOptions", "context_option_keys",
           "tuning_option_keys"]

GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
              "iq4_nl": 20, "bf16": 30}
#: ``flash_attn`` values, llama-server's spellings included (``enabled``, ``true``, ``1``, ...).
_FLASH = {"auto": -1, "-1": -1, "off": 0, "disabled": 0, "false": 0, "0": 0, "on": 1,
          "enabled": 1, "true": 1, "1": 1, False: 0, True: 1}
_POOLING = {"unspecified": -1, "none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
_ATTENTION = {"unspecified": -1, "causal": 0, "non_causal": 1}
_ROPE_SCALING = {"unspecified": -1, "none": 0, "linear": 1, "yarn": 2, "longrope": 3}


def _enum(table: dict[Any, int], value: Any, name: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return table[value]
    except (KeyError, TypeError):
        pass
    valid = sorted(str(k) for k in table)
    raise InvalidOptionError(f"{name} must be one of {valid}, got {value!r}", option=name)


class Context(Owned):
    """A llama.cpp context: KV memory, decode, logits and per-sequence state.

    One context must be used from one thread at a time. It keeps its model alive and is freed
    before it (``close()`` is idempotent; use after close raises
    :class:`~llamapy.errors.ClosedError`).
    """

    KIND = "context"

    def __init__(self, model: Model, options: ContextOptions | None = None, **kwargs: Any):
        if options is None:
            unknown = set(kwargs) - set(context_option_keys())
            if unknown:
                raise UnknownOptionError(unknown, context_option_keys(), where="context")
            options = ContextOptions(**kwargs)
        self.model = model
        self.options = options
        self._ptr: Any = None
        model._retain()
        try:
            self._ptr = self._create(model, options)
        except BaseException:
            model._release()
            raise
        lib = native().lib
        self._memory = lib.llama_get_memory(self._ptr)
        self.n_ctx = int(lib.llama_n_ctx(self._ptr))
        self.n_ctx_seq = int(lib.llama_n_ctx_seq(self._ptr))
        self.n_batch = int(lib.llama_n_batch(self._ptr))
        self.n_ubatch = int(lib.llama_n_ubatch(self._ptr))
        self.n_seq_max = int(lib.llama_n_seq_max(self._ptr))
        self.n_vocab = model.n_vocab
        ffi = native().ffi
        # llamapy_heartbeat: [0] counts ggml's calls while a decode computes, [1] aborts it
        self._beat = ffi.new("int64_t[2]")
        lib.llama_set_abort_callback(self._ptr, ffi.addressof(native().shim, "llamapy_heartbeat"),
                                     self._beat)
        self._code = native().ffi.new("int32_t *")  # llama_decode's return code, via the shim
        self._what = native().ffi.new("char[]", WHAT_SIZE)

    @staticmethod
    def _create(model: Model, o: ContextOptions) -> Any:
        lib = native().lib
        p = lib.llama_context_default_params()
        for name in ("n_ctx", "n_ubatch", "n_seq_max", "offload_kqv", "op_offload",
                     "embeddings", "swa_full", "kv_unified", "no_perf", "rope_freq_base",
                     "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast",
                     "yarn_beta_slow", "yarn_orig_ctx"):
            setattr(p, name, getattr(o, name))
        p.n_batch = o.effective_n_batch
        p.n_threads = o.n_threads or physical_cores()
        p.n_threads_batch = o.n_threads_batch or p.n_threads
        p.type_k = _enum(GGML_TYPES, o.type_k, "type_k")
        p.type_v = _enum(GGML_TYPES, o.type_v, "type_v")
        p.flash_attn_type = _enum(_FLASH, o.flash_attn, "flash_attn")
        p.pooling_type = _enum(_POOLING, o.pooling_type, "pooling_type")
        p.attention_type = _enum(_ATTENTION, o.attention_type, "attention_type")
        p.rope_scaling_type = _enum(_ROPE_SCALING, o.rope_scaling_type, "rope_scaling_type")
        with _logging.loud_call() as lines:
            ptr = lib.llama_init_from_model(model.ptr, p)
        return not_null(ptr, lambda: NativeError("failed to create context: " + (
            _logging.captured_message(lines, "llama_init_from_model returned NULL"))))

    # --- lifetime -----------------------------------------------------------------------------

    def _free(self, ptr: Any) -> None:
        """Free the context, then let the model go."""
        native().lib.llama_free(ptr)
        self.model._release()

    # --- decode and outputs -------------------------------------------------------------------

    def decode(self, batch: Batch | EmbeddingBatch) -> None:
        """Decode a batch; a non-zero return code raises its typed :class:`DecodeError` (a C++
        exception, caught by the shim, :class:`~llamapy.errors.DecodeExceptionError`)."""
        if batch.n_tokens == 0:
            return
        status = native().shim.llamapy_decode(self.ptr, batch.struct, self._code, self._what,
                                              WHAT_SIZE)
        check_error(status, self._what, "llama_decode")
        if self._code[0] != 0:
            raise decode_error(int(self._code[0]))

    def logits(self, index: int) -> np.ndarray:
        """Logits of batch row ``index`` (-1 = last output) as a zero-copy float32 view.

        The view is valid until the next decode. numpy is imported on first use (a server that
        never reads logits or embeddings never imports it).
        """
        import numpy as np

        ffi, lib = native().ffi, native().lib
        ptr = not_null(lib.llama_get_logits_ith(self.ptr, index),
                       lambda: NativeError(f"no logits for batch index {index}"))
        return np.frombuffer(ffi.buffer(ptr, self.n_vocab * 4), dtype=np.float32)

    def embeddings(self, index: int) -> np.ndarray:
        """Embedding of batch row ``index`` (pooling none), copied."""
        return self._embd(native().lib.llama_get_embeddings_ith(self.ptr, index), index)

    def sequence_embeddings(self, seq_id: int, width: int | None = None) -> np.ndarray:
        """Pooled embedding of a sequence (pooling mean/cls/last: ``n_embd`` floats; rank: the
        classifier's ``n_cls_out`` scores, pass that ``width``), copied."""
        return self._embd(native().lib.llama_get_embeddings_seq(self.ptr, seq_id), seq_id,
                          width)

    def _embd(self, ptr: Any, which: int, width: int | None = None) -> np.ndarray:
        import numpy as np

        not_null(ptr, lambda: NativeError(f"no embeddings for {which} (is embeddings=True?)"))
        n = self.model.n_embd if width is None else width
        vector: np.ndarray = np.frombuffer(c_bytes(ptr, n * 4), dtype=np.float32).copy()
        return vector

    def set_abort(self, flag: bool) -> None:
        """Ask a running decode to abort (returns code 2) until cleared."""
        self._beat[1] = int(flag)

    @property
    def progress(self) -> int:
        """A count that advances while a decode computes (any thread may read it): a decode
        that runs long but whose count moves is working, not stuck."""
        return int(self._beat[0])

    @property
    def pooling(self) -> str:
        """The pooling the context applies (``none`` unless it computes embeddings with one:
        ``mean``, ``cls``, ``last`` or ``rank``), the model's own where none was asked for."""
        if not self.options.embeddings:
            return "none"
        code = int(native().lib.llama_pooling_type(self.ptr))
        return next((name for name, value in _POOLING.items() if value == code), "none")

    def set_causal_attn(self, causal: bool) -> None:
        """Decode with causal attention (a generative model's default) or bidirectional
        attention (an image chunk of a projector that needs it)."""
        native().lib.llama_set_causal_attn(self.ptr, bool(causal))

    @property
    def causal_attn(self) -> bool:
        """Whether the context decodes with causal attention now."""
        return bool(native().lib.llama_get_causal_attn(self.ptr))

    def set_adapters(self, adapters: Sequence[tuple[LoraAdapter, float]]) -> None:
        """Attach LoRA adapters with scales (an empty list detaches all)."""
        ffi, lib = native().ffi, native().lib
        ptrs = ffi.new("struct llama_adapter_lora *[]", [a.ptr for a, _ in adapters] or 1)
        scales = ffi.new("float[]", [float(s) for _, s in adapters] or 1)
        if lib.llama_set_adapters_lora(self.ptr, ptrs, len(adapters), scales) != 0:
            raise NativeError("llama_set_adapters_lora failed")

    # --- memory -------------------------------------------------------------------------------

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove ``seq_id``'s cells in ``[p0, p1)``; False if a partial removal is impossible."""
        self.ptr  # noqa: B018
        return bool(native().lib.llama_memory_seq_rm(self._memory, seq_id, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Copy ``src``'s cells in ``[p0, p1)`` to ``dst`` (metadata only on a unified KV)."""
        self.ptr  # noqa: B018
        native().lib.llama_memory_seq_cp(self._memory, src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        """Remove every sequence but ``seq_id``."""
        self.ptr  # noqa: B018
        native().lib.llama_memory_seq_keep(self._memory, seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Shift positions of ``seq_id`` in ``[p0, p1)`` by ``delta``."""
        self.ptr  # noqa: B018
        native().lib.llama_memory_seq_add(self._memory, seq_id, p0, p1, delta)

    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest position of ``seq_id`` (-1 if empty)."""
        self.ptr  # noqa: B018
        return int(native().lib.llama_memory_seq_pos_min(self._memory, seq_id))

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position of ``seq_id`` (-1 if empty)."""
        self.ptr  # noqa: B018
        return int(native().lib.llama_memory_seq_pos_max(self._memory, seq_id))

    def clear(self, data: bool = False) -> None:
        """Clear all memory (and the data buffers when ``data``)."""
        self.ptr  # noqa: B018
        native().lib.llama_memory_clear(self._memory, data)

    def state_seq_size(self, seq_id: int, partial: bool = False) -> int:
        """Bytes :meth:`state_seq_get` would return (``llama_state_seq_get_size_ext``)."""
        return int(native().lib.llama_state_seq_get_size_ext(self.ptr, seq_id,
                                                              _flags(partial)))

    def state_seq_get(self, seq_id: int, partial: bool = False) -> bytes:
        """Serialise one sequence's state (its KV cells); with ``partial`` only the state that
        cannot be trimmed back (recurrent, sliding-window), as a context checkpoint."""
        ffi, lib = native().ffi, native().lib
        flags = _flags(partial)
        size = lib.llama_state_seq_get_size_ext(self.ptr, seq_id, flags)
        buf = ffi.new("uint8_t[]", max(1, size))
        n = lib.llama_state_seq_get_data_ext(self.ptr, buf, size, seq_id, flags)
        return c_bytes(buf, n)

    def state_seq_set(self, seq_id: int, data: bytes, partial: bool = False) -> bool:
        """Load a state from :meth:`state_seq_get` (with the same ``partial``) into
        ``seq_id``; False on failure."""
        ffi, lib = native().ffi, native().lib
        src = ffi.from_buffer("uint8_t[]", data)
        return bool(lib.llama_state_seq_set_data_ext(self.ptr, src, len(data), seq_id,
                                                     _flags(partial)) > 0)

    def perf(self) -> dict[str, float]:
        """llama.cpp's context perf counters (needs ``no_perf=False``)."""
        data = native().lib.llama_perf_context(self.ptr)
        return {name: getattr(data, name) for name, _ in native().ffi.typeof(data).fields}

    def reset_perf(self) -> None:
        """Reset the perf counters."""
        native().lib.llama_perf_context_reset(self.ptr)

    def warmup(self) -> None:
        """llama-server's warm-up run: decode BOS and EOS once on sequence 0, then clear the
        memory and the perf counters. The one-time costs of a first decode (compute buffers,
        the first touch of the mapped weights) are paid here instead of by the first request.
        A model with an encoder is left as it is."""
        model, lib = self.model, native().lib
        if lib.llama_model_has_encoder(model.ptr):
            return
        tokens = [t for t in (model.bos, model.eos) if t >= 0] or [0]
        batch = Batch(len(tokens))
        batch.add(0, 0, tokens[:self.n_batch])
        self.decode(batch)
        self.clear(data=True)
        lib.llama_synchronize(self.ptr)
        self.reset_perf()


class _Rows:
    """The arrays of a preallocated ``llama_batch`` (one sequence id per row) and its
    ``n_tokens``: rows of token ids, or (``width`` > 0) of embeddings ``width`` floats each."""

    def __init__(self, capacity: int, width: int = 0) -> None:
        if capacity <= 0 or width < 0:
            raise InvalidOptionError("batch capacity must be positive", option="n_batch")
        ffi = native().ffi
        self.capacity, self.width = capacity, width
        self._token = ffi.new("llama_token[]", capacity) if width == 0 else ffi.NULL
        self._embd = ffi.new("float[]", capacity * width) if width else ffi.NULL
        self._pos = ffi.new("llama_pos[]", capacity)
        self._n_seq = ffi.new("int32_t[]", capacity)
        self._seq = ffi.new("llama_seq_id[]", capacity)
        self._seq_ptrs = ffi.new("llama_seq_id *[]", capacity)
        self._logits = ffi.new("int8_t[]", capacity)
        for i in range(capacity):
            self._seq_ptrs[i] = self._seq + i
        self._n_seq[0:capacity] = [1] * capacity
        self.struct = ffi.new("struct llama_batch *")
        s = self.struct
        s.token, s.embd, s.pos, s.n_seq_id = self._token, self._embd, self._pos, self._n_seq
        s.seq_id, s.logits, s.n_tokens = self._seq_ptrs, self._logits, 0

    @property
    def n_tokens(self) -> int:
        """Rows currently in the batch."""
        return int(self.struct.n_tokens)

    def clear(self) -> None:
        """Empty the batch (no per-element work)."""
        self.struct.n_tokens = 0


class Batch(_Rows):
    """A preallocated ``llama_batch`` of token ids filled through cffi arrays.

    ``add(seq_id, start_pos, token_ids, logits_last, n_outputs)`` appends a run of tokens for one
    sequence (with output rows for its last ``n_outputs`` tokens when ``logits_last``); the
    returned index is the batch row of the run's last token (for sampling and logits).
    """

    def add(self, seq_id: int, start_pos: int, token_ids: Sequence[int],
            logits_last: bool = True, n_outputs: int = 1) -> int:
        """Append ``token_ids`` of ``seq_id`` at positions from ``start_pos``; return last row.
        With ``logits_last`` the last ``n_outputs`` tokens get output rows (a speculative
        draft's verification reads one per drafted position)."""
        n = int(self.struct.n_tokens)
        k = len(token_ids)
        if k == 0:
            raise InvalidOptionError("cannot add an empty run of tokens")
        if n + k > self.capacity:
            raise InvalidOptionError(f"batch overflow: {n} + {k} > capacity {self.capacity}")
        end = n + k
        if k == 1:  # a decode step: four element stores
            self._token[n], self._pos[n], self._seq[n] = token_ids[0], start_pos, seq_id
            self._logits[n] = 1 if logits_last else 0
            self.struct.n_tokens = end
            return n
        self._token[n:end] = token_ids
        self._pos[n:end] = range(start_pos, start_pos + k)
        self._seq[n:end] = [seq_id] * k
        outputs = min(max(n_outputs, 1), k) if logits_last else 0
        self._logits[n:end] = [0] * (k - outputs) + [1] * outputs
        self.struct.n_tokens = end
        return end - 1


class EmbeddingBatch(_Rows):
    """A preallocated ``llama_batch`` of embeddings (``llama_batch.embd``, no token ids): rows
    of an encoded image or audio clip, ``width`` float32 each, decoded like tokens at their
    positions. No row asks for logits."""

    def __init__(self, capacity: int, width: int) -> None:
        if width <= 0:
            raise InvalidOptionError("embedding width must be positive", option="n_batch")
        super().__init__(capacity, width)

    def add(self, seq_id: int, start_pos: int, rows: bytes | memoryview,
            outputs: bool = False) -> None:
        """Append ``rows`` (whole float32 rows of :attr:`width`) of ``seq_id`` from
        ``start_pos`` (each an output row with ``outputs``: an embeddings context pools
        them)."""
        size = self.width * 4
        k, n = len(rows) // size, int(self.struct.n_tokens)
        if k == 0 or k * size != len(rows) or n + k > self.capacity:
            raise InvalidOptionError(f"embedding batch: {len(rows)} bytes do not make whole "
                                     f"rows of {self.width} floats within the capacity")
        ffi = native().ffi
        ffi.memmove(self._embd + n * self.width, rows, len(rows))
        self._pos[n:n + k] = range(start_pos, start_pos + k)
        self._seq[n:n + k] = [seq_id] * k
        self._logits[n:n + k] = [int(outputs)] * k
        self.struct.n_tokens = n + k


def _flags(partial: bool) -> int:
    """``llama_state_seq_flags``: ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`` when ``partial``."""
    return 1 if partial else 0
