"""Context creation options and the sizing defaults every layer shares.

One default per name: a context holds :data:`N_CTX` tokens, decodes at most
``min(n_ctx, N_BATCH_MAX)`` per call (:func:`default_n_batch`), serves :data:`N_PARALLEL`
sequences (a server's ``n_parallel`` is its context's ``n_seq_max``) over one unified KV pool
(:data:`KV_UNIFIED`). ``_native.Context`` maps these options to ``llama_context_params``;
0 / "unspecified" means llama.cpp's (or the model's) own value.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamapy.options._spec import check, check_typed_fields, is_int, option, option_names

__all__ = [
    "KV_RUNTIME_KEYS",
    "KV_UNIFIED",
    "N_BATCH_MAX",
    "N_CTX",
    "N_PARALLEL",
    "SERVER_OWNED_KEYS",
    "ContextOptions",
    "context_option_keys",
    "default_n_batch",
    "tuning_option_keys",
]

#: Context tokens (shared by every sequence when the KV is unified).
N_CTX = 8192
#: Sequences (server slots) per context.
N_PARALLEL = 4
#: The default ``n_batch`` is ``min(n_ctx, N_BATCH_MAX)``.
N_BATCH_MAX = 2048
#: One KV cell pool shared by all sequences.
KV_UNIFIED = True


def default_n_batch(n_ctx: int) -> int:
    """The default logical batch size for a context of ``n_ctx`` tokens."""
    return min(n_ctx, N_BATCH_MAX)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextOptions:
    """Context creation options (the single source of their names and defaults).

    ``n_batch=None`` means ``min(n_ctx, 2048)`` (:attr:`effective_n_batch`).
    """

    n_ctx: int = option(N_CTX, "context size in tokens (shared by all slots when kv_unified)")
    n_batch: int | None = option(None, "most tokens per decode call (default: min(n_ctx, 2048))")
    n_ubatch: int = option(512, "physical batch: most tokens per compute graph",
                           flags=("-ub", "--ubatch-size"))
    n_seq_max: int = option(N_PARALLEL, "sequences the context serves (a server's n_parallel)")
    n_threads: int = option(0, "threads for generation (0 = the physical core count)",
                            flags=("-t", "--threads"))
    n_threads_batch: int = option(0, "threads for prompt processing (0 = n_threads)",
                                  flags=("-tb", "--threads-batch"))
    type_k: str = option("f16", "KV cache type of K: f32, f16, bf16, q8_0, q4_0, ...",
                         flags=("-ctk", "--cache-type-k"))
    type_v: str = option("f16", "KV cache type of V: f32, f16, bf16, q8_0, q4_0, ...",
                         flags=("-ctv", "--cache-type-v"))
    flash_attn: str | bool = option("auto", "flash attention: auto, on or off",
                                    flags=("-fa",))
    offload_kqv: bool = option(True, "keep the KV cache and attention on the GPU")
    op_offload: bool = option(True, "offload host tensor operations to the device")
    rope_scaling_type: str = option(
        "unspecified", "RoPE scaling: unspecified (the model's), none, linear, yarn, longrope")
    rope_freq_base: float = option(0.0, "RoPE base frequency (0 = the model's)")
    rope_freq_scale: float = option(0.0, "RoPE frequency scale (0 = the model's)")
    yarn_ext_factor: float = option(-1.0, "YaRN extrapolation mix factor (-1 = the model's)")
    yarn_attn_factor: float = option(-1.0, "YaRN attention magnitude (-1 = the model's)")
    yarn_beta_fast: float = option(-1.0, "YaRN low correction dimension (-1 = the model's)")
    yarn_beta_slow: float = option(-1.0, "YaRN high correction dimension (-1 = the model's)")
    yarn_orig_ctx: int = option(0, "YaRN original context size (0 = the model's)")
    attention_type: str = option("unspecified", "attention: unspecified, causal, non_causal")
    pooling_type: str = option(
        "unspecified", "embedding pooling: unspecified, none, mean, cls, last, rank",
        flags=("--pooling",))
    embeddings: bool = option(False, "compute embeddings instead of logits")
    swa_full: bool = option(True, "full-size KV cache for sliding-window attention layers")
    kv_unified: bool = option(KV_UNIFIED, "one KV cell pool shared by all sequences")
    no_perf: bool = option(True, "skip llama.cpp's performance timers")

    def __post_init__(self) -> None:
        check_typed_fields(self)
        for name in ("n_ctx", "n_ubatch", "n_seq_max"):
            check(getattr(self, name) >= 1, name, "must be >= 1")
        check(self.n_batch is None or (is_int(self.n_batch) and self.n_batch >= 1), "n_batch",
              "must be an integer >= 1 (or None)")
        check(self.n_threads >= 0 and self.n_threads_batch >= 0, "n_threads", "must be >= 0")
        for name in ("offload_kqv", "op_offload", "embeddings", "swa_full", "kv_unified",
                     "no_perf"):
            check(isinstance(getattr(self, name), bool), name, "must be a bool")

    @property
    def effective_n_batch(self) -> int:
        """``n_batch``, defaulting to ``min(n_ctx, 2048)``."""
        return self.n_batch if self.n_batch is not None else default_n_batch(self.n_ctx)


#: Context options that change what the KV cache holds: a session manifest's runtime and the
#: disk prompt cache's namespace include them.
KV_RUNTIME_KEYS = ("type_k", "type_v", "flash_attn", "rope_scaling_type", "rope_freq_base",
                   "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast",
                   "yarn_beta_slow", "yarn_orig_ctx", "swa_full")


def context_option_keys() -> list[str]:
    """Every context option name."""
    return list(option_names(ContextOptions))


#: Context options a server sets from its own sizing (``n_parallel`` is ``n_seq_max``).
SERVER_OWNED_KEYS = ("n_ctx", "n_batch", "n_seq_max", "kv_unified")


def tuning_option_keys() -> list[str]:
    """Context options a server forwards (everything but the sizing it owns)."""
    return list(option_names(ContextOptions, exclude=SERVER_OWNED_KEYS))
