"""Tiny hybrid language models with arbitrary weights: attention layers beside recurrent ones.

A hybrid model's recurrent state holds the whole prefix in a fixed-size summary, so it cannot
be trimmed back to an arbitrary position as a KV cache can; these models let tests exercise
what that changes (context checkpoints, state save and restore, prefix reuse) on real libllama
in well under a second per decode.

``lfm2`` (the default, :func:`llamapy.testing.tiny_hybrid_path`): LFM2's short-convolution
blocks around one attention block. ``qwen35``: Qwen 3.5's gated delta-net blocks, then one
gated attention block with interleaved multi-axis RoPE. Both are 64 wide with 3 blocks,
trained (nominally) on 8192 positions, with tied output embeddings.

The vocabulary is byte-level BPE: the 256 GPT-2 byte tokens, a handful of merges and ChatML's
``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` (control tokens; ``<|im_end|>`` ends a
turn), so any text tokenizes, about one token a byte, and decodes back unchanged. The GGUF
carries a ChatML chat template. Every weight comes from integer hashing of the element's
index and a per-tensor salt (crc32 of its name), so the files' bytes are the same on every
machine (:data:`TINY_HYBRID_SHA256` pins them).

What random weights can prove: loading, tokenization, plumbing, caching, state save and
restore, and that one output computed two ways (whole or in pieces, fresh or restored) is
the same. What they cannot: anything about quality; the text they generate is noise.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import InvalidOptionError

__all__ = ["ARCHES", "DEFAULT_ARCH", "TINY_HYBRID_SHA256", "write_tiny_hybrid"]

#: The written files' sha256, by architecture (``gguf`` 0.19; integer-arithmetic weights).
TINY_HYBRID_SHA256 = {
    "lfm2": "62e5c6625cd88870d66102a99a4d00df562879c51fadb8eba8e3d8714e3f070e",
    "qwen35": "cfb6e74d2aa3d044d348af66518ebf6b90c1371a8310cd281c28cbe7c99d366d",
}
ARCHES = tuple(TINY_HYBRID_SHA256)
DEFAULT_ARCH = "lfm2"

_EMBD, _FF, _HEADS, _HEADS_KV, _HEAD_DIM, _LAYERS, _CTX = 64, 128, 4, 2, 16, 3, 8192
_MERGES = ("\u0120 t", "\u0120 a", "t h", "i n", "e r")
_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message.role }}\n"
             "{{ message.content }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _weights(name: str, shape: tuple[int, ...], scale: float = 0.4) -> Any:
    """float32 values in [-scale/2, scale/2) from a 64-bit integer hash (splitmix64's
    finaliser) of each element's index and the tensor name's crc32."""
    import numpy as np

    salt = zlib.crc32(name.encode()) * 0x9E3779B97F4A7C15 % (1 << 64)
    h = np.arange(int(np.prod(shape)), dtype=np.uint64) + np.uint64(salt)
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        h = (h ^ (h >> np.uint64(shift))) * np.uint64(mult)
    h = h ^ (h >> np.uint64(31))
    unit = (h >> np.uint64(40)).astype(np.float64) / float(1 << 24)
    return ((unit - 0.5) * scale).astype(np.float32).reshape(shape)


class _Tensors:
    """Adds tensors by name with numpy shapes (the reverse of ggml's ``ne``)."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def rand(self, name: str, *shape: int) -> None:
        self.writer.add_tensor(name, _weights(name, shape))

    def fill(self, name: str, n: int, value: float) -> None:
        import numpy as np

        self.writer.add_tensor(name, np.full((n,), value, dtype=np.float32))

    def ffn(self, i: int) -> None:
        self.rand(f"blk.{i}.ffn_gate.weight", _FF, _EMBD)
        self.rand(f"blk.{i}.ffn_up.weight", _FF, _EMBD)
        self.rand(f"blk.{i}.ffn_down.weight", _EMBD, _FF)

    def qk_norms(self, i: int) -> None:
        self.fill(f"blk.{i}.attn_q_norm.weight", _HEAD_DIM, 1.0)
        self.fill(f"blk.{i}.attn_k_norm.weight", _HEAD_DIM, 1.0)


def _vocab() -> list[str]:
    """GPT-2's byte-to-unicode characters in byte order, the merges' results, the specials."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    extra = iter(range(256, 512))
    chars = [chr(b) if b in printable else chr(next(extra)) for b in range(256)]
    return [*chars, *(m.replace(" ", "") for m in _MERGES), *_SPECIALS]


def _tokenizer(w: Any) -> None:
    import gguf

    tokens = _vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in _SPECIALS else gguf.TokenType.NORMAL
                       for t in tokens])
    w.add_token_merges(list(_MERGES))
    ids = {t: tokens.index(t) for t in _SPECIALS}
    w.add_bos_token_id(ids["<|endoftext|>"])
    w.add_eos_token_id(ids["<|im_end|>"])
    w.add_eot_token_id(ids["<|im_end|>"])
    w.add_pad_token_id(ids["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(_TEMPLATE)


def _common(w: Any, arch: str) -> None:
    """The keys every architecture here reads the same way."""
    w.add_name(f"llamapy-tiny-{arch}")
    w.add_description("tiny generated hybrid model with arbitrary weights, for tests")
    w.add_context_length(_CTX)
    w.add_embedding_length(_EMBD)
    w.add_feed_forward_length(_FF)
    w.add_block_count(_LAYERS)
    w.add_head_count(_HEADS)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)  # all float32
    _tokenizer(w)


def _lfm2(w: Any, t: _Tensors) -> None:
    """Blocks 0 and 2 short convolutions, block 1 attention (no KV heads marks a conv)."""
    attention = {1}
    w.add_head_count_kv([_HEADS_KV if i in attention else 0 for i in range(_LAYERS)])
    w.add_shortconv_l_cache(3)
    w.add_vocab_size(len(_vocab()))
    t.rand("token_embd.weight", len(_vocab()), _EMBD)
    t.fill("token_embd_norm.weight", _EMBD, 1.0)  # LFM2's output norm goes by this name
    for i in range(_LAYERS):
        t.fill(f"blk.{i}.attn_norm.weight", _EMBD, 1.0)
        t.fill(f"blk.{i}.ffn_norm.weight", _EMBD, 1.0)
        t.ffn(i)
        if i in attention:
            t.qk_norms(i)
            t.rand(f"blk.{i}.attn_q.weight", _HEADS * _HEAD_DIM, _EMBD)
            t.rand(f"blk.{i}.attn_k.weight", _HEADS_KV * _HEAD_DIM, _EMBD)
            t.rand(f"blk.{i}.attn_v.weight", _HEADS_KV * _HEAD_DIM, _EMBD)
            t.rand(f"blk.{i}.attn_output.weight", _EMBD, _HEADS * _HEAD_DIM)
        else:
            t.rand(f"blk.{i}.shortconv.conv.weight", _EMBD, 3)
            t.rand(f"blk.{i}.shortconv.in_proj.weight", 3 * _EMBD, _EMBD)
            t.rand(f"blk.{i}.shortconv.out_proj.weight", _EMBD, _EMBD)


#: Qwen 3.5's delta-net sizes: key heads, value heads, head width, convolution kernel.
_K_HEADS, _V_HEADS, _SSM_HEAD, _CONV = 2, 4, 16, 4


def _qwen35(w: Any, t: _Tensors) -> None:
    """Blocks 0 and 1 gated delta-nets, block 2 gated attention (every third is)."""
    w.add_head_count_kv(_HEADS_KV)
    w.add_key_length(_HEAD_DIM)
    w.add_value_length(_HEAD_DIM)
    w.add_rope_dimension_count(_HEAD_DIM // 2)
    w.add_rope_dimension_sections([2, 1, 1, 0])  # halves of the rotated dimensions
    w.add_full_attention_interval(3)
    for add, value in ((w.add_ssm_conv_kernel, _CONV), (w.add_ssm_state_size, _SSM_HEAD),
                       (w.add_ssm_group_count, _K_HEADS), (w.add_ssm_time_step_rank, _V_HEADS),
                       (w.add_ssm_inner_size, _SSM_HEAD * _V_HEADS)):
        add(value)
    t.rand("token_embd.weight", len(_vocab()), _EMBD)
    t.fill("output_norm.weight", _EMBD, 1.0)
    for i in range(_LAYERS):
        t.fill(f"blk.{i}.attn_norm.weight", _EMBD, 1.0)
        t.fill(f"blk.{i}.post_attention_norm.weight", _EMBD, 1.0)
        t.ffn(i)
        if (i + 1) % 3 == 0:
            t.qk_norms(i)
            t.rand(f"blk.{i}.attn_q.weight", 2 * _HEADS * _HEAD_DIM, _EMBD)  # query and gate
            t.rand(f"blk.{i}.attn_k.weight", _HEADS_KV * _HEAD_DIM, _EMBD)
            t.rand(f"blk.{i}.attn_v.weight", _HEADS_KV * _HEAD_DIM, _EMBD)
            t.rand(f"blk.{i}.attn_output.weight", _EMBD, _HEADS * _HEAD_DIM)
        else:
            _delta_net(t, i)


def _delta_net(t: _Tensors, i: int) -> None:
    import numpy as np

    keys, values = _K_HEADS * _SSM_HEAD, _V_HEADS * _SSM_HEAD
    t.rand(f"blk.{i}.attn_qkv.weight", 2 * keys + values, _EMBD)
    t.rand(f"blk.{i}.attn_gate.weight", values, _EMBD)
    t.rand(f"blk.{i}.ssm_conv1d.weight", 2 * keys + values, _CONV)
    t.rand(f"blk.{i}.ssm_dt.bias", _V_HEADS)
    # -exp(A_log) in the checkpoint: negative, so the state decays and stays finite
    decay = -0.5 - np.abs(_weights(f"blk.{i}.ssm_a", (_V_HEADS,)))
    t.writer.add_tensor(f"blk.{i}.ssm_a", decay.astype(np.float32))
    t.rand(f"blk.{i}.ssm_beta.weight", _V_HEADS, _EMBD)
    t.rand(f"blk.{i}.ssm_alpha.weight", _V_HEADS, _EMBD)
    t.fill(f"blk.{i}.ssm_norm.weight", _SSM_HEAD, 1.0)
    t.rand(f"blk.{i}.ssm_out.weight", _EMBD, values)


_BUILDERS: dict[str, Callable[[Any, _Tensors], None]] = {"lfm2": _lfm2, "qwen35": _qwen35}


def write_tiny_hybrid(out: str | os.PathLike[str], arch: str = DEFAULT_ARCH) -> Path:
    """Write the tiny hybrid model of ``arch`` (one of :data:`ARCHES`) to ``out``."""
    import gguf

    if arch not in _BUILDERS:
        raise InvalidOptionError(f"no tiny hybrid model for {arch!r}; one of "
                                 f"{', '.join(ARCHES)}", option="arch")
    w = gguf.GGUFWriter(str(out), arch)
    _common(w, arch)
    _BUILDERS[arch](w, _Tensors(w))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)
