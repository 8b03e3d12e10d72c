"""Lazy loading of libllama, llamapy's shim and the generated cffi module (the one place that
dlopens).

Nothing happens at import time. The first call to :func:`native` imports the out-of-line ABI
module that ``build_lib.py`` generated, finds the library (``$LLAMAPY_LIB``, then the build
cache), checks struct layouts against the build's probe, opens the shim built next to the
library (the libllama calls that can throw, wrapped: :mod:`._shim`) and checks its ABI,
initialises the backend and routes llama.cpp's log to :mod:`logging`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from .._paths import current_build
from ..errors import LayoutMismatchError, LibraryNotFoundError

log = logging.getLogger("llamapy.llama_cpp")

_BUILD_HINT = "run `python build_lib.py` from the llamapy checkout to build it"
_LIB_NAMES = ("libllama.so", "libllama.dylib", "llama.dll")
_MTMD_NAMES = ("libmtmd.so", "libmtmd.dylib", "mtmd.dll")
_SHIM_NAMES = ("libllamapy_shim.so", "libllamapy_shim.dylib", "llamapy_shim.dll")
#: The ``LLAMAPY_SHIM_ABI`` of ``shim/llamapy_shim.h`` this code calls.
SHIM_ABI = 3


class Native(NamedTuple):
    """The loaded binding: cffi's ``ffi``, the ``lib`` of libllama and the ``shim`` library."""

    ffi: Any
    lib: Any
    lib_path: Path
    shim: Any


_lock = threading.Lock()
_native: Native | None = None


def native() -> Native:
    """The loaded binding, loading it on first use."""
    global _native
    if _native is None:
        with _lock:
            if _native is None:
                _native = _load()
    return _native


_media_lib: Any = None


def media_lib() -> Any:
    """libmtmd (llama.cpp's multimodal library, built next to libllama), opened on first use
    with its log routed to :mod:`logging` like libllama's."""
    global _media_lib
    nat = native()
    if _media_lib is None:
        with _lock:
            if _media_lib is None:
                _media_lib = _open_media(nat)
    return _media_lib


def _open_media(nat: Native) -> Any:
    folder = nat.lib_path.parent
    path = next((folder / n for n in _MTMD_NAMES if (folder / n).is_file()), None)
    if path is None:
        raise LibraryNotFoundError(f"libmtmd is missing next to {nat.lib_path}; {_BUILD_HINT}")
    try:
        lib = nat.ffi.dlopen(str(path))
    except OSError as exc:
        raise LibraryNotFoundError(f"cannot load {path}: {exc}; {_BUILD_HINT}") from exc
    from . import _logging

    _logging.install_media(lib)
    return lib


def c_bytes(buf: Any, n: int) -> bytes:
    """The ``n`` bytes at a C buffer, NUL bytes included."""
    data: bytes = native().ffi.buffer(buf, n)[:]
    return data


def c_text(ptr: Any, n: int = -1) -> str:
    """A C string as text (UTF-8, undecodable bytes replaced): up to the first NUL, or at most
    ``n`` bytes."""
    data: bytes = native().ffi.string(ptr, n) if n >= 0 else native().ffi.string(ptr)
    return data.decode("utf-8", "replace")


def _ffi_module() -> ModuleType:
    try:
        from . import _llama_ffi  # type: ignore[attr-defined, unused-ignore]

        return _llama_ffi
    except ImportError:
        pass
    build = current_build()
    path = Path(build["build_dir"]) / "_llama_ffi.py" if build else None
    if path is None or not path.exists():
        raise LibraryNotFoundError(f"the generated cffi module is missing; {_BUILD_HINT}")
    spec = importlib.util.spec_from_file_location("llamapy._native._llama_ffi", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def find_library() -> Path:
    """The libllama path: ``$LLAMAPY_LIB`` (file or folder), else the current build."""
    env = os.environ.get("LLAMAPY_LIB")
    candidates: list[Path] = []
    if env:
        p = Path(env).expanduser()
        candidates += [p] if p.is_file() else [p / n for n in _LIB_NAMES]
    else:
        build = current_build()
        if build:
            candidates += [Path(build["lib_dir"]) / n for n in _LIB_NAMES]
    for path in candidates:
        if path.is_file():
            return path
    where = f"LLAMAPY_LIB={env}" if env else "the build cache"
    raise LibraryNotFoundError(f"libllama not found in {where}; {_BUILD_HINT}")


def layout_file(lib_path: Path) -> Path:
    """The layout probe output recorded next to the library's build."""
    return lib_path.parent.parent / "layout.json"


def check_layout(ffi: Any, layout: dict[str, dict[str, int]]) -> list[str]:
    """Differences between the C compiler's struct layouts and cffi's; empty when they agree."""
    problems = []
    for struct, fields in layout.items():
        ctype = f"struct {struct}"
        try:
            size = ffi.sizeof(ctype)
        except Exception:  # cffi raises plain ffi.error for unknown types
            problems.append(f"{ctype}: unknown to cffi")
            continue
        if size != fields["__sizeof__"]:
            problems.append(f"{ctype}: sizeof C={fields['__sizeof__']} cffi={size}")
        for name, offset in fields.items():
            if name != "__sizeof__" and ffi.offsetof(ctype, name) != offset:
                problems.append(
                    f"{ctype}.{name}: offsetof C={offset} cffi={ffi.offsetof(ctype, name)}"
                )
    return problems


def load_shim(ffi: Any, lib_path: Path) -> Any:
    """Open the shim built next to ``lib_path``; a missing one, or one of another ABI than
    this code's (or than the generated module declares), is a typed error."""
    path = next((lib_path.parent / n for n in _SHIM_NAMES if (lib_path.parent / n).is_file()),
                None)
    if path is None:
        raise LibraryNotFoundError(f"llamapy's shim is missing next to {lib_path}; {_BUILD_HINT}")
    try:
        shim = ffi.dlopen(str(path))
        compiled, declared = int(shim.llamapy_shim_abi()), int(shim.LLAMAPY_SHIM_ABI)
    except (OSError, AttributeError) as exc:
        raise LibraryNotFoundError(f"cannot load the shim {path}: {exc}; {_BUILD_HINT}") from exc
    if not compiled == declared == SHIM_ABI:
        raise LibraryNotFoundError(
            f"the shim {path} has ABI {compiled} (declared {declared}), this llamapy expects "
            f"{SHIM_ABI}; {_BUILD_HINT}")
    return shim


def _load() -> Native:
    module = _ffi_module()
    ffi = module.ffi
    lib_path = find_library()
    try:
        lib = ffi.dlopen(str(lib_path))
    except OSError as exc:
        raise LibraryNotFoundError(f"cannot load {lib_path}: {exc}; {_BUILD_HINT}") from exc
    shim = load_shim(ffi, lib_path)
    probe = layout_file(lib_path)
    if probe.exists():
        problems = check_layout(ffi, json.loads(probe.read_text()))
        if problems:
            raise LayoutMismatchError("struct layout mismatch: " + "; ".join(problems))
    from . import _logging

    _logging.install(ffi, lib)
    lib.llama_backend_init()
    return Native(ffi, lib, lib_path, shim)
