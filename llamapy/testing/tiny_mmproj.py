"""The tiny multimodal projectors of :mod:`llamapy.testing`, with arbitrary weights.

``mlp`` (LLaVA-1.5's kind, :func:`llamapy.testing.tiny_mmproj_path`) for the 576-wide default
model: images are resized to 32x32 and cut into 8x8 patches, so every image becomes 16
embeddings, decoded with causal attention like text. ``gemma3``
(:func:`llamapy.testing.tiny_gemma3_mmproj_path`) for Gemma 3 270M (640 wide): the same tower,
its 4x4 patches average-pooled 2x2 into 4 embeddings between ``<start_of_image>`` and
``<end_of_image>``, decoded together with bidirectional attention, as Gemma 3's images are.

``qwen2a`` (Qwen2-Audio's kind, :func:`llamapy.testing.tiny_audio_mmproj_path`) for the
default model: a Whisper-style encoder (two 1-D convolutions over 80 mel bins, then the same
kind of tower) and a linear projection; libmtmd cuts audio into 30-second windows, each 750
embeddings.

The towers are 32 wide with 2 heads and 2 blocks. Every value comes from integer arithmetic
on the element's index and a per-tensor salt (crc32 of its name), so the files' bytes are the
same on every machine. Layer norms are identity (weight 1, bias 0).
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

__all__ = ["write_tiny_audio_mmproj", "write_tiny_gemma3_mmproj", "write_tiny_mmproj"]

_IMAGE, _PATCH, _EMBD, _HEADS, _FF, _BLOCKS, _HIDDEN = 32, 8, 32, 2, 64, 2, 64


def _weights(name: str, shape: tuple[int, ...]) -> Any:
    import numpy as np

    salt = zlib.crc32(name.encode())
    index = np.arange(int(np.prod(shape)), dtype=np.int64)
    mixed = (index * 2654435761 + salt) % 65521
    return (((mixed.astype(np.float64) / 65521.0) - 0.5) * 0.4).astype(np.float32).reshape(shape)


def write_tiny_mmproj(out: str | os.PathLike[str], n_embd_text: int = 576) -> Path:
    """Write the tiny ``mlp`` projector for a text model ``n_embd_text`` wide to ``out``."""
    return _write(out, "mlp", n_embd_text)


def write_tiny_gemma3_mmproj(out: str | os.PathLike[str], n_embd_text: int = 640) -> Path:
    """Write the tiny ``gemma3`` projector for a Gemma 3 model ``n_embd_text`` wide."""
    return _write(out, "gemma3", n_embd_text)


def _write(out: str | os.PathLike[str], kind: str, n_embd_text: int) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(out), arch="clip")
    w.add_string("general.name", "llamapy-tiny-mmproj" if kind == "mlp"
                 else f"llamapy-tiny-{kind}-mmproj")
    w.add_string("general.description", "tiny generated mmproj with arbitrary weights, for tests")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", kind)
    w.add_bool("clip.use_gelu", True)
    keys = [("embedding_length", _EMBD), ("attention.head_count", _HEADS),
            ("feed_forward_length", _FF), ("block_count", _BLOCKS),
            ("projection_dim", n_embd_text), ("image_size", _IMAGE), ("patch_size", _PATCH)]
    if kind == "gemma3":
        keys.append(("projector.scale_factor", 2))
    for key, value in keys:
        w.add_uint32(f"clip.vision.{key}", value)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    for key in ("image_mean", "image_std"):
        w.add_key_value(f"clip.vision.{key}", [0.5, 0.5, 0.5], gguf.GGUFValueType.ARRAY,
                        sub_type=gguf.GGUFValueType.FLOAT32)
    _tower(w)
    _projection(w, kind, n_embd_text)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)


def _add(w: Any, name: str, *shape: int) -> None:
    """numpy shapes (the reverse of ggml's ``ne``)."""
    w.add_tensor(name, _weights(name, shape))


def _const(w: Any, name: str, value: float) -> None:
    import numpy as np

    w.add_tensor(name, np.full((_EMBD,), value, dtype=np.float32))


def _tower(w: Any) -> None:
    _add(w, "v.patch_embd.weight", _EMBD, 3, _PATCH, _PATCH)
    _add(w, "v.patch_embd.bias", _EMBD)
    _add(w, "v.position_embd.weight", (_IMAGE // _PATCH) ** 2, _EMBD)
    for i in range(_BLOCKS):
        p = f"v.blk.{i}"
        for x in ("q", "k", "v", "out"):
            _add(w, f"{p}.attn_{x}.weight", _EMBD, _EMBD)
            _add(w, f"{p}.attn_{x}.bias", _EMBD)
        _block_ffn(w, p)


def _block_ffn(w: Any, p: str) -> None:
    """A block's norms and feed-forward."""
    _const(w, f"{p}.ln1.weight", 1.0)
    _const(w, f"{p}.ln1.bias", 0.0)
    _add(w, f"{p}.ffn_up.weight", _FF, _EMBD)
    _add(w, f"{p}.ffn_up.bias", _FF)
    _add(w, f"{p}.ffn_down.weight", _EMBD, _FF)
    _add(w, f"{p}.ffn_down.bias", _EMBD)
    _const(w, f"{p}.ln2.weight", 1.0)
    _const(w, f"{p}.ln2.bias", 0.0)


def _projection(w: Any, kind: str, n_embd_text: int) -> None:
    if kind == "mlp":
        _add(w, "mm.0.weight", _HIDDEN, _EMBD)
        _add(w, "mm.0.bias", _HIDDEN)
        _add(w, "mm.2.weight", n_embd_text, _HIDDEN)
        _add(w, "mm.2.bias", n_embd_text)
        return
    _const(w, "v.post_ln.weight", 1.0)
    _const(w, "v.post_ln.bias", 0.0)
    _add(w, "mm.input_projection.weight", _EMBD, n_embd_text)
    _const(w, "mm.soft_emb_norm.weight", 1.0)


def write_tiny_audio_mmproj(out: str | os.PathLike[str], n_embd_text: int = 576) -> Path:
    """Write the tiny ``qwen2a`` audio projector for a text model ``n_embd_text`` wide."""
    import gguf

    mel, positions = 80, 1500  # Whisper's mel bins, and its 30 s window's positions
    w = gguf.GGUFWriter(str(out), arch="clip")
    w.add_string("general.name", "llamapy-tiny-audio-mmproj")
    w.add_string("general.description", "tiny generated mmproj with arbitrary weights, for tests")
    w.add_bool("clip.has_audio_encoder", True)
    w.add_string("clip.projector_type", "qwen2a")
    for key, value in (("embedding_length", _EMBD), ("attention.head_count", _HEADS),
                       ("feed_forward_length", _FF), ("block_count", _BLOCKS),
                       ("projection_dim", n_embd_text), ("num_mel_bins", mel)):
        w.add_uint32(f"clip.audio.{key}", value)
    w.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    _add(w, "a.conv1d.1.weight", _EMBD, mel, 3)
    _add(w, "a.conv1d.1.bias", _EMBD, 1)
    _add(w, "a.conv1d.2.weight", _EMBD, _EMBD, 3)
    _add(w, "a.conv1d.2.bias", _EMBD, 1)
    _add(w, "a.position_embd.weight", positions, _EMBD)
    for i in range(_BLOCKS):
        p = f"a.blk.{i}"
        for x, bias in (("q", True), ("k", False), ("v", True), ("out", True)):
            _add(w, f"{p}.attn_{x}.weight", _EMBD, _EMBD)
            if bias:  # (Whisper's keys have none)
                _add(w, f"{p}.attn_{x}.bias", _EMBD)
        _block_ffn(w, p)
    _const(w, "a.post_ln.weight", 1.0)
    _const(w, "a.post_ln.bias", 0.0)
    _add(w, "mm.a.fc.weight", n_embd_text, _EMBD)
    _add(w, "mm.a.fc.bias", n_embd_text)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)
