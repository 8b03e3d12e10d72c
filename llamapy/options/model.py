"""Model loading options: the single source of their names and defaults.

``_native.Model`` maps them to ``llama_model_params``. ``vocab_only`` is a model option only:
a ``Server`` refuses it (a vocabulary-only model cannot decode), see
:data:`MODEL_ONLY_KEYS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamapy.options._spec import check, option, option_names

__all__ = [
    "LOAD_MODE_DIRECT_IO",
    "LOAD_MODE_MLOCK",
    "LOAD_MODE_MMAP",
    "LOAD_MODE_MMAP_MLOCK",
    "LOAD_MODE_NONE",
    "MODEL_ONLY_KEYS",
    "SPLIT_MODES",
    "ModelOptions",
    "load_option_keys",
]

#: ``split_mode`` names and their ``llama_split_mode`` values.
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}
LOAD_MODE_NONE, LOAD_MODE_MMAP, LOAD_MODE_MLOCK, LOAD_MODE_MMAP_MLOCK, LOAD_MODE_DIRECT_IO = (
    0, 1, 2, 3, 4,
)
#: Loading options ``Model`` takes and a ``Server`` never does.
MODEL_ONLY_KEYS = ("vocab_only",)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelOptions:
    """Model loading options (the single source of their names and defaults)."""

    n_gpu_layers: int = option(99, "layers offloaded to the GPU (99 = all)",
                               flags=("-ngl", "--gpu-layers"))
    main_gpu: int = option(0, "the GPU used when split_mode is none")
    split_mode: str = option("layer", "how to split over GPUs: none, layer, row or tensor")
    tensor_split: tuple[float, ...] = option((), "share of the model on each GPU")
    use_mmap: bool = option(True, "memory-map the model file")
    use_mlock: bool = option(False, "lock the model in RAM")
    use_direct_io: bool = option(False, "read the model with direct I/O (wins over mmap/mlock)")
    check_tensors: bool = option(False, "validate tensor data while loading")
    vocab_only: bool = option(False, "load only the vocabulary (a Server refuses it)")

    def __post_init__(self) -> None:
        check(self.split_mode in SPLIT_MODES, "split_mode", f"must be one of {sorted(SPLIT_MODES)}")
        object.__setattr__(self, "tensor_split", tuple(self.tensor_split))

    @property
    def load_mode(self) -> int:
        """llama.cpp's single ``load_mode``: direct I/O wins, else mmap and mlock combine."""
        if self.use_direct_io:
            return LOAD_MODE_DIRECT_IO
        if self.use_mmap:
            return LOAD_MODE_MMAP_MLOCK if self.use_mlock else LOAD_MODE_MMAP
        return LOAD_MODE_MLOCK if self.use_mlock else LOAD_MODE_NONE


def load_option_keys() -> list[str]:
    """The model loading option names (every one ``Model`` accepts)."""
    return list(option_names(ModelOptions))
