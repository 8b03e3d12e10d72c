"""Helpers for tests and experiments that need artefacts no registry ships.

:func:`write_random_lora` writes a LoRA adapter GGUF with random low-rank tensors for a llama
architecture base model (needs the ``gguf`` package from the ``test`` extra).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


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
