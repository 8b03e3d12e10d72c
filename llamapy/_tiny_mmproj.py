"""The tiny multimodal projector of :func:`llamapy.testing.tiny_mmproj_path`: a LLaVA-1.5
style (``mlp``) vision projector for the 576-wide default model, with arbitrary weights.

Geometry: images are resized to 32x32 and cut into 8x8 patches, so every image becomes 16
embeddings; the vision tower is 32 wide with 2 heads and 2 blocks (LLaVA's graph runs all but
the last); the projector maps 32 -> 64 -> 576. Every value comes from integer arithmetic on the
element's index and a per-tensor salt (crc32 of its name), so the file's bytes are the same on
every machine. Layer norms are identity (weight 1, bias 0).
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

__all__ = ["write_tiny_mmproj"]

_IMAGE, _PATCH, _EMBD, _HEADS, _FF, _BLOCKS, _HIDDEN = 32, 8, 32, 2, 64, 2, 64


def _weights(name: str, shape: tuple[int, ...]) -> Any:
    import numpy as np

    salt = zlib.crc32(name.encode())
    index = np.arange(int(np.prod(shape)), dtype=np.int64)
    mixed = (index * 2654435761 + salt) % 65521
    return (((mixed.astype(np.float64) / 65521.0) - 0.5) * 0.4).astype(np.float32).reshape(shape)


def write_tiny_mmproj(out: str | os.PathLike[str], n_embd_text: int = 576) -> Path:
    """Write the tiny projector for a text model ``n_embd_text`` wide to ``out``."""
    import gguf

    w = gguf.GGUFWriter(str(out), arch="clip")
    w.add_string("general.name", "llamapy-tiny-mmproj")
    w.add_string("general.description", "tiny generated mmproj with arbitrary weights, for tests")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.use_gelu", True)
    for key, value in (("embedding_length", _EMBD), ("attention.head_count", _HEADS),
                       ("feed_forward_length", _FF), ("block_count", _BLOCKS),
                       ("projection_dim", n_embd_text), ("image_size", _IMAGE),
                       ("patch_size", _PATCH)):
        w.add_uint32(f"clip.vision.{key}", value)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    for key in ("image_mean", "image_std"):
        w.add_key_value(f"clip.vision.{key}", [0.5, 0.5, 0.5], gguf.GGUFValueType.ARRAY,
                        sub_type=gguf.GGUFValueType.FLOAT32)
    _tensors(w, n_embd_text)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)


def _tensors(w: Any, n_embd_text: int) -> None:
    """numpy shapes (the reverse of ggml's ``ne``)."""
    import numpy as np

    def add(name: str, *shape: int) -> None:
        w.add_tensor(name, _weights(name, shape))

    def const(name: str, value: float) -> None:
        w.add_tensor(name, np.full((_EMBD,), value, dtype=np.float32))

    add("v.patch_embd.weight", _EMBD, 3, _PATCH, _PATCH)
    add("v.patch_embd.bias", _EMBD)
    add("v.position_embd.weight", (_IMAGE // _PATCH) ** 2, _EMBD)
    for i in range(_BLOCKS):
        p = f"v.blk.{i}"
        for x in ("q", "k", "v", "out"):
            add(f"{p}.attn_{x}.weight", _EMBD, _EMBD)
            add(f"{p}.attn_{x}.bias", _EMBD)
        const(f"{p}.ln1.weight", 1.0)
        const(f"{p}.ln1.bias", 0.0)
        add(f"{p}.ffn_up.weight", _FF, _EMBD)
        add(f"{p}.ffn_up.bias", _FF)
        add(f"{p}.ffn_down.weight", _EMBD, _FF)
        add(f"{p}.ffn_down.bias", _EMBD)
        const(f"{p}.ln2.weight", 1.0)
        const(f"{p}.ln2.bias", 0.0)
    add("mm.0.weight", _HIDDEN, _EMBD)
    add("mm.0.bias", _HIDDEN)
    add("mm.2.weight", n_embd_text, _HIDDEN)
    add("mm.2.bias", n_embd_text)
