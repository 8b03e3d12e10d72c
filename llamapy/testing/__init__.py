"""Helpers for tests and experiments that need artefacts no registry ships.

:func:`write_random_lora` writes a LoRA adapter GGUF with random low-rank tensors for a llama
architecture base model; :func:`tiny_reranker_path` writes (once, into the model cache) a tiny
BERT reranker with arbitrary weights, byte for byte the same on every machine and checked
against :data:`TINY_RERANKER_SHA256`; :func:`tiny_mmproj_path` does the same for a tiny
vision projector of the default model (:data:`TINY_MMPROJ_SHA256`) and
:func:`tiny_gemma3_mmproj_path` for one of the second test model, :func:`tiny_audio_mmproj_path`
for an audio projector of the default model; :func:`tiny_hybrid_path` a tiny hybrid language
model (attention beside recurrent blocks: LFM2's or Qwen 3.5's) pinned in
:data:`TINY_HYBRID_SHA256`. All need the ``gguf`` package from the ``test`` extra.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._paths import cache_dir, sha256_file
from ..errors import ModelNotFoundError
from .tiny_hybrid import DEFAULT_ARCH as DEFAULT_HYBRID_ARCH
from .tiny_hybrid import TINY_HYBRID_SHA256 as TINY_HYBRID_SHA256


def write_random_lora(base_model: str | os.PathLike[str], out: str | os.PathLike[str], *,
                      rank: int = 8, alpha: float = 16.0, std: float = 0.05, seed: int = 0,
                      targets: Sequence[str] = ("attn_q", "attn_v")) -> Path:
    """Write a random LoRA adapter for ``base_model`` to ``out`` and return its path.

    For every ``blk.N.<target>.weight`` of the base model it adds ``lora_a`` (rank x n_in) and
    ``lora_b`` (n_out x rank) float32 tensors, so the adapter really changes the model's output.
    """
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(base_model))
    arch_field = reader.fields["general.architecture"]
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(alpha))
    suffixes = tuple(f".{t}.weight" for t in targets)
    for tensor in reader.tensors:
        if not (tensor.name.startswith("blk.") and tensor.name.endswith(suffixes)):
            continue
        n_in, n_out = (int(x) for x in tensor.shape[:2])
        a = rng.normal(0.0, std, size=(rank, n_in)).astype(np.float32)
        b = rng.normal(0.0, std, size=(n_out, rank)).astype(np.float32)
        writer.add_tensor(f"{tensor.name}.lora_a", a)
        writer.add_tensor(f"{tensor.name}.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(out)


#: The tiny reranker's bytes (written with ``gguf`` 0.19; the weights are integer arithmetic,
#: so no platform's floating point or random stream can change them).
TINY_RERANKER_SHA256 = "f97fcc44be36b1ab47e5fd49c52f53479999914d685041c6f18021628a93fdf9"
#: Its vocabulary: BERT's special tokens, some words, and single characters, each as a word
#: start ("\u2581" prefixed, as llama.cpp's WordPiece vocabularies are stored) and inside one.
_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_WORDS = ("machine", "learning", "is", "a", "the", "of", "and", "paris", "city", "which",
          "to", "field", "study", "data", "process", "system", "power", "france", "art")
_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.,?!'"


#: The tiny projector's bytes (``gguf`` 0.19; integer-arithmetic weights, as the reranker's).
TINY_MMPROJ_SHA256 = "a5282eb7c1effffa79c5e2c9004319003dea29272d6c7e135372f03ff66be074"


def tiny_mmproj_path(fetch: bool = True) -> Path:
    """The tiny multimodal projector in the model cache, written first when missing (with
    ``fetch``).

    A LLaVA-style vision projector for the default model (SmolLM2-135M, 576 wide): every image
    becomes 16 embeddings. Its weights are arbitrary: answers about an image prove plumbing,
    caching and errors, never that the model saw anything.
    """
    from .tiny_mmproj import write_tiny_mmproj

    return _generated("tiny-mmproj.gguf", write_tiny_mmproj, TINY_MMPROJ_SHA256, fetch)


#: The tiny Gemma 3 projector's bytes (see :func:`tiny_gemma3_mmproj_path`).
TINY_GEMMA3_MMPROJ_SHA256 = "b29c46fe564d7de8c91ff743604c9c088d4898259892e5836085bd35723083ec"


def tiny_gemma3_mmproj_path(fetch: bool = True) -> Path:
    """The tiny Gemma 3 vision projector in the model cache, written first when missing.

    For the second test model (Gemma 3 270M, 640 wide): every image becomes 4 embeddings
    between ``<start_of_image>`` and ``<end_of_image>``, decoded together with bidirectional
    attention, as Gemma 3's are. Arbitrary weights, as :func:`tiny_mmproj_path`'s.
    """
    from .tiny_mmproj import write_tiny_gemma3_mmproj

    return _generated("tiny-gemma3-mmproj.gguf", write_tiny_gemma3_mmproj,
                      TINY_GEMMA3_MMPROJ_SHA256, fetch)


#: The tiny audio projector's bytes (see :func:`tiny_audio_mmproj_path`).
TINY_AUDIO_MMPROJ_SHA256 = "7d1634008c2012191b97784a6734aae8cc5036ca5b72874bf3dbf657f5327d5a"


def tiny_audio_mmproj_path(fetch: bool = True) -> Path:
    """The tiny audio projector of the default model in the model cache, written first when
    missing: a Whisper-style encoder (Qwen2-Audio's kind) whose 30-second windows become 750
    embeddings each. Arbitrary weights, as :func:`tiny_mmproj_path`'s."""
    from .tiny_mmproj import write_tiny_audio_mmproj

    return _generated("tiny-audio-mmproj.gguf", write_tiny_audio_mmproj,
                      TINY_AUDIO_MMPROJ_SHA256, fetch)


def tiny_hybrid_path(fetch: bool = True, arch: str = DEFAULT_HYBRID_ARCH) -> Path:
    """The tiny hybrid model of ``arch`` (``"lfm2"`` or ``"qwen35"``) in the model cache,
    written first when missing (with ``fetch``).

    64 wide, 3 blocks (recurrent ones and one attention block), 8192 positions, a byte-level
    vocabulary with ChatML's tokens and template (:mod:`llamapy.testing.tiny_hybrid`). Its weights
    are arbitrary: outputs prove plumbing, caching and state save and restore, never quality.
    """
    from .tiny_hybrid import write_tiny_hybrid

    if arch not in TINY_HYBRID_SHA256:
        raise ModelNotFoundError(f"no tiny hybrid model for {arch!r}; one of "
                                 f"{', '.join(TINY_HYBRID_SHA256)}")
    return _generated(f"tiny-{arch}.gguf", lambda out: write_tiny_hybrid(out, arch),
                      TINY_HYBRID_SHA256[arch], fetch)


def _generated(name: str, write: Any, sha256: str, fetch: bool) -> Path:
    """A generated test artefact in the model cache, written and checked when missing."""
    path = cache_dir() / "models" / name
    if not path.is_file():
        if not fetch:
            raise ModelNotFoundError(f"{name} not found at {path}")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        write(tmp)
        got = sha256_file(tmp)
        if got != sha256:
            tmp.unlink()
            raise ModelNotFoundError(f"sha256 mismatch for the generated {name}: {got}")
        tmp.replace(path)
    return path


def tiny_reranker_path(fetch: bool = True) -> Path:
    """The tiny reranker in the model cache, written first when missing (with ``fetch``).

    A 2-layer BERT (``n_embd`` 32) with a one-output classifier head and rank pooling, so a
    server started with ``--reranking`` on it scores (query, document) pairs. Its weights are
    arbitrary: the scores prove plumbing, batching, ordering and errors, never relevance.
    """
    return _generated("tiny-reranker.gguf", write_tiny_reranker, TINY_RERANKER_SHA256, fetch)


def _weights(shape: tuple[int, ...], salt: int, scale: float = 0.4) -> Any:
    """Arbitrary float32 weights in [-scale/2, scale/2) from integer hashing only."""
    import numpy as np

    index = np.arange(int(np.prod(shape)), dtype=np.int64)
    mixed = (index * 2654435761 + salt * 40503 + 12345) % 65521
    return ((mixed / 65521.0 - 0.5) * scale).astype(np.float32).reshape(shape)


def write_tiny_reranker(out: str | os.PathLike[str]) -> Path:
    """Write the tiny reranker (see :func:`tiny_reranker_path`) to ``out``."""
    import gguf

    tokens = list(dict.fromkeys([*_SPECIALS, *("\u2581" + w for w in _WORDS),
                                 *("\u2581" + c for c in _CHARS), *_CHARS]))
    n_embd, n_ff, n_layer, n_ctx = 32, 64, 2, 512
    writer = gguf.GGUFWriter(str(out), "bert")
    writer.add_name("tiny-reranker")
    for add, value in ((writer.add_context_length, n_ctx), (writer.add_embedding_length, n_embd),
                       (writer.add_feed_forward_length, n_ff), (writer.add_block_count, n_layer),
                       (writer.add_head_count, 2), (writer.add_token_type_count, 2)):
        add(value)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_tokenizer_model("bert")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in _SPECIALS else gguf.TokenType.NORMAL
                            for t in tokens])
    for role, token in (("pad", 0), ("unk", 1), ("bos", 2), ("eos", 3), ("sep", 3),
                        ("mask", 4)):
        getattr(writer, f"add_{role}_token_id")(token)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    _reranker_tensors(writer, len(tokens), n_embd, n_ff, n_layer, n_ctx)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(out)


def _reranker_tensors(writer: Any, n_vocab: int, n_embd: int, n_ff: int, n_layer: int,
                      n_ctx: int) -> None:
    import numpy as np

    salt = iter(range(1, 1000))

    def add(name: str, *shape: int, fill: float | None = None) -> None:
        data = (np.full(shape, fill, dtype=np.float32) if fill is not None
                else _weights(shape, next(salt)))
        writer.add_tensor(name, data)

    add("token_embd.weight", n_vocab, n_embd)
    add("token_types.weight", 2, n_embd)
    add("position_embd.weight", n_ctx, n_embd)
    add("token_embd_norm.weight", n_embd, fill=1.0)
    add("token_embd_norm.bias", n_embd, fill=0.0)
    for i in range(n_layer):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            add(f"blk.{i}.{part}.weight", n_embd, n_embd)
            add(f"blk.{i}.{part}.bias", n_embd, fill=0.0)
        for norm in ("attn_output_norm", "layer_output_norm"):
            add(f"blk.{i}.{norm}.weight", n_embd, fill=1.0)
            add(f"blk.{i}.{norm}.bias", n_embd, fill=0.0)
        add(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        add(f"blk.{i}.ffn_up.bias", n_ff, fill=0.0)
        add(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
        add(f"blk.{i}.ffn_down.bias", n_embd, fill=0.0)
    add("cls.weight", n_embd, n_embd)
    add("cls.bias", n_embd, fill=0.0)
    add("cls.output.weight", 1, n_embd)
    add("cls.output.bias", 1, fill=0.0)
