"""Model loading options: the single source of their names and defaults.

``_native.Model`` maps them to ``llama_model_params``. ``vocab_only`` is a model option only:
a ``Server`` refuses it (a vocabulary-only model cannot decode), see
:data:`MODEL_ONLY_KEYS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamapy.options._spec import check, is_int, option, option_names

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
#: llama-server's ``-ngl`` words. ``auto`` fits layers to free VRAM there; here every layer
#: goes to the GPU (libllama's negative value), as ``all`` does.
GPU_LAYER_WORDS = {"all": -1, "auto": -1}


def _is_int_text(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _rpc_endpoints(value: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``rpc_servers`` as a tuple of ``host:port`` (a plain string may list them by commas)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    endpoints = tuple(str(item).strip() for item in items if str(item).strip())
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        check(bool(host) and ":" not in host and port.isdigit() and 0 < int(port) < 65536,
              "rpc_servers", f"must be host:port entries (no IPv6 literal), got {endpoint!r}")
    check(len(set(endpoints)) == len(endpoints), "rpc_servers", f"lists a server twice: {value!r}")
    return endpoints


#: Loading options ``Model`` takes and a ``Server`` never does.
MODEL_ONLY_KEYS = ("vocab_only",)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelOptions:
    """Model loading options (the single source of their names and defaults)."""

    n_gpu_layers: int | str = option(
        99, "layers offloaded to the GPU (99, all, auto or a negative number = all)",
        flags=("-ngl", "--gpu-layers"))
    main_gpu: int = option(0, "the GPU used when split_mode is none", flags=("-mg",))
    split_mode: str = option("layer", "how to split over GPUs: none, layer, row or tensor",
                             flags=("-sm",))
    tensor_split: tuple[float, ...] = option((), "share of the model on each GPU",
                                             flags=("-ts",))
    use_mmap: bool = option(True, "memory-map the model file")
    use_mlock: bool = option(False, "lock the model in RAM")
    use_direct_io: bool = option(False, "read the model with direct I/O (wins over mmap/mlock)")
    check_tensors: bool = option(False, "validate tensor data while loading")
    vocab_only: bool = option(False, "load only the vocabulary (a Server refuses it)")
    rpc_servers: tuple[str, ...] = option(
        (), "ggml RPC servers (host:port, comma-separated) whose devices take the model's "
        "layers; they split a model over hosts, they add no throughput; the transport is "
        "unauthenticated: bind them to loopback or a private network", flags=("--rpc",))

    def __post_init__(self) -> None:
        object.__setattr__(self, "rpc_servers", _rpc_endpoints(self.rpc_servers))
        layers = self.n_gpu_layers
        if isinstance(layers, str):  # llama-server's spellings; libllama: negative = all
            check(layers.strip().lower() in GPU_LAYER_WORDS or _is_int_text(layers),
                  "n_gpu_layers", f"must be a number, 'all' or 'auto', got {layers!r}")
            layers = GPU_LAYER_WORDS.get(layers.strip().lower()) or int(layers)
        check(is_int(layers), "n_gpu_layers", f"must be an integer, got {layers!r}")
        object.__setattr__(self, "n_gpu_layers", layers)
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
