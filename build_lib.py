#!/usr/bin/env python3
"""Build libllama from the pinned llama.cpp source and generate llamapy's cffi binding.

Steps (each prints a phase line; a failure names the step and its log file):

1. fetch   ``pip download --no-deps --no-binary :all: llama-cpp-python==<pin>``, verify sha256
2. extract ``vendor/llama.cpp`` into ``<cache>/src/``
3. configure + build the shared ``llama`` target (with ggml's RPC backend), ``ggml-rpc-server``
   and ``mtmd`` (libmtmd: images and audio through an mmproj) with CMake (+ Ninja when present) into
   ``<cache>/build/<key>``, where ``key`` hashes (source sha256, build flags, compiler)
4. generate the cffi declarations from the preprocessed pinned headers (``llama.h`` and the
   shim's header, ``mtmd.h`` and ``mtmd-helper.h``) and write the out-of-line ABI module
   ``llamapy/_native/_llama_ffi.py``
5. compile the shim (``llamapy/_native/shim/``: the libllama calls that can throw, wrapped in
   try/catch) against the built library into ``libllamapy_shim`` next to it
6. compile and run a layout probe that records ``sizeof``/``offsetof`` of every ``llama_*``
   and ``mtmd_*`` struct in ``<build>/layout.json`` (the test suite compares it with cffi's view)

A second run with the same key is a no-op that prints where the library is, unless the shim's
sources or the binding's generator changed: then steps 4 to 6 run again (seconds), not the
library's build. ``<cache>`` is
``$LLAMAPY_CACHE`` or ``~/.cache/llamapy``.

Usage: ``python build_lib.py [--cuda] [--blas] [--no-native] [--rpc] [--jobs N]
[--with-server] [--print-path]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from build_binding import (  # noqa: E402
    FFI_MODULE,
    SHIM_DIR,
    SHIM_HEADER,
    StepError,
    preprocess_headers,
    run_layout_probe,
    write_ffi_module,
)
from llamapy._paths import cache_dir, current_build_file, sha256_file  # noqa: E402
from llamapy._pins import LLAMA_CPP_SOURCE  # noqa: E402

SHIM_SOURCE = SHIM_DIR / "llamapy_shim.cpp"
#: The shim's binding of llama.cpp's chat layer (``common/chat.h``, in libllama-common).
SHIM_CHAT_SOURCE = SHIM_DIR / "llamapy_chat.cpp"
SHIM_LIBRARY = {"darwin": "libllamapy_shim.dylib", "win32": "llamapy_shim.dll"}.get(
    sys.platform, "libllamapy_shim.so")
SERVER_TARGETS = ("llama-server", "llama-bench")
#: ggml's RPC server, which lends this host's devices to a libllama elsewhere (``rpc_servers``);
#: one small program, built with the library so every build can split a model over hosts.
RPC_TARGETS = ("ggml-rpc-server",)
#: libmtmd, llama.cpp's multimodal library (images and audio through a model's ``--mmproj``).
MEDIA_TARGETS = ("mtmd",)
#: libllama-common: llama.cpp's chat layer (templates, tool-call grammars, output parsers),
#: which the shim binds.
CHAT_TARGETS = ("llama-common",)


def phase(message: str) -> None:
    print(f"[build_lib] {message}", flush=True)


def run_logged(step: str, cmd: list[str], log: Path, *, cwd: Path | None = None) -> None:
    """Run ``cmd``, teeing progress lines (ninja's ``[n/N]``) and logging everything."""
    log.parent.mkdir(parents=True, exist_ok=True)
    last_pct = -10
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            m = re.match(r"\[(\d+)/(\d+)\]", line) or re.match(r"\[\s*(\d+)%\]", line)
            if m:
                pct = int(m.group(1)) * 100 // int(m.group(2)) if m.lastindex == 2 else int(
                    m.group(1)
                )
                if pct >= last_pct + 10:
                    last_pct = pct
                    phase(f"  {step}: {pct}%")
        if proc.wait() != 0:
            raise StepError(f"step '{step}' failed (exit {proc.returncode}); see {log}")


# --- fetch and extract -------------------------------------------------------------------------


def fetch_sdist(cache: Path) -> Path:
    downloads = cache / "downloads"
    path = downloads / LLAMA_CPP_SOURCE.filename
    if path.exists() and sha256_file(path) == LLAMA_CPP_SOURCE.sha256:
        return path
    phase(f"fetch: pip download {LLAMA_CPP_SOURCE.requirement}")
    downloads.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "-d", str(downloads), LLAMA_CPP_SOURCE.requirement]
    run_logged("fetch", cmd, cache / "logs" / "fetch.log")
    got = sha256_file(path)
    if got != LLAMA_CPP_SOURCE.sha256:
        path.unlink()
        raise StepError(f"step 'fetch': sha256 mismatch for {path.name}: {got}")
    return path


def extract_source(cache: Path, sdist: Path) -> Path:
    dest = cache / "src" / f"llama.cpp-{LLAMA_CPP_SOURCE.sha256[:16]}"
    if (dest / ".extracted").exists():
        return dest
    phase(f"extract: {LLAMA_CPP_SOURCE.member} -> {dest}")
    prefix = LLAMA_CPP_SOURCE.member.rstrip("/") + "/"
    tmp = Path(tempfile.mkdtemp(dir=cache / "src" if (cache / "src").exists() else None))
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(tmp, members=[m for m in members if m.name], filter="tar")
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(dest)
    (dest / ".extracted").write_text(LLAMA_CPP_SOURCE.sha256)
    return dest


# --- configure and build -----------------------------------------------------------------------


#: Native builds leave Intel AMX out. ``-march=native`` on a CPU that reports AMX compiles
#: ggml's AMX matmul kernels, and on virtual machines that do not hand AMX tile state to the
#: guest every decode then dies with a general protection fault (seen on this project's CI
#: machines: llama-bench and llama-server crash the same way). The explicit ``-mno-amx-*``
#: flags win over ``-march=native`` whatever their order; AMX gains little at our batch sizes.
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
NO_AMX_FLAGS = ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
                f"-DCMAKE_C_FLAGS={_NO_AMX}", f"-DCMAKE_CXX_FLAGS={_NO_AMX}"]


def cmake_flags(args: argparse.Namespace) -> list[str]:
    flags = [
        "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON",
        "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
        "-DLLAMA_BUILD_COMMON=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
        # The RPC backend is always in: it costs nothing until servers are registered
        # (``rpc_servers``), and one build then serves both uses.
        "-DGGML_RPC=ON",
        # libmtmd without video: its video path runs ffprobe/ffmpeg on request bytes (and is
        # where a malformed image falls through to); llamapy takes images and audio only.
        "-DMTMD_VIDEO=OFF",
        f"-DGGML_NATIVE={'OFF' if args.no_native else 'ON'}",
    ]
    if not args.no_native:
        flags += NO_AMX_FLAGS
    if args.cuda:
        flags.append("-DGGML_CUDA=ON")
    if args.blas:
        flags += ["-DGGML_BLAS=ON", "-DGGML_BLAS_VENDOR=OpenBLAS"]
    return flags


def compiler_id() -> str:
    cc = os.environ.get("CC", "cc")
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True)
        return out.stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return cc


def build_key(flags: list[str]) -> str:
    material = json.dumps([LLAMA_CPP_SOURCE.sha256, flags, compiler_id(), sys.platform])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def build_library(src: Path, build: Path, flags: list[str], jobs: int, targets: list[str]) -> None:
    log = build / "build.log"
    if not (build / "CMakeCache.txt").exists():
        phase(f"configure: cmake ({' '.join(f for f in flags if 'GGML' in f)})")
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        run_logged("configure", ["cmake", "-S", str(src), "-B", str(build), *gen, *flags], log)
    phase(f"build: {', '.join(targets)} with -j{jobs} (log: {log})")
    cmd = ["cmake", "--build", str(build), "-j", str(jobs)]
    for target in targets:
        cmd += ["--target", target]
    run_logged("build", cmd, log)


# --- the shim -----------------------------------------------------------------------------------


def shim_compiler(build: Path) -> str:
    """The C++ compiler CMake used for the library (``$CXX`` or ``c++`` before a build)."""
    cache = build / "CMakeCache.txt"
    text = cache.read_text(errors="replace") if cache.exists() else ""
    found = re.search(r"^CMAKE_CXX_COMPILER:\w+=(.+)$", text, flags=re.M)
    return found.group(1).strip() if found else os.environ.get("CXX", "c++")


def shim_key(build: Path, key: str) -> str:
    """What the shim and the binding are built from: the shim's sources, the binding's
    generator, the C++ compiler and the library's key."""
    cxx = shim_compiler(build)
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    material = [key, cxx, version.splitlines()[:1], SHIM_HEADER.read_text(),
                SHIM_SOURCE.read_text(), SHIM_CHAT_SOURCE.read_text(),
                (SHIM_DIR / "llamapy_guard.hpp").read_text(),
                (ROOT / "build_binding.py").read_text()]
    return hashlib.sha256(json.dumps(material).encode()).hexdigest()[:16]


def build_shim(src: Path, build: Path) -> None:
    """Compile the shim and link it against the built libllama, in the library's folder."""
    target = lib_dir_of(build) / SHIM_LIBRARY
    partial = target.with_name(target.name + ".partial")  # a loaded shim is replaced, not changed
    origin = "@loader_path" if sys.platform == "darwin" else "$ORIGIN"
    cmd = [shim_compiler(build), "-std=c++17", "-O2", "-fPIC", "-shared",
           "-fvisibility=hidden", "-o", str(partial), str(SHIM_SOURCE), str(SHIM_CHAT_SOURCE),
           f"-I{src / 'include'}", f"-I{src / 'ggml' / 'include'}", f"-I{src / 'common'}",
           f"-L{target.parent}", "-lllama-common", "-lllama", f"-Wl,-rpath,{origin}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise StepError(f"step 'shim': compile failed:\n{out.stderr}")
    os.replace(partial, target)


# --- main ---------------------------------------------------------------------------------------


def lib_dir_of(build: Path) -> Path:
    return build / "bin"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cuda", action="store_true", help="build the CUDA backend")
    p.add_argument("--blas", action="store_true", help="build the BLAS backend (OpenBLAS)")
    p.add_argument("--no-native", action="store_true", help="portable build (no -march=native)")
    p.add_argument("--rpc", action="store_true",
                   help="accepted: the RPC backend and ggml-rpc-server are always built")
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 2, help="parallel jobs")
    p.add_argument("--with-server", action="store_true",
                   help="also build llama-server and llama-bench (for side-by-side benchmarks)")
    p.add_argument("--print-path", action="store_true",
                   help="print the library directory of the current build and exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cache = cache_dir()
    if args.print_path:
        try:
            print(json.loads(current_build_file().read_text())["lib_dir"])
            return 0
        except (OSError, ValueError, KeyError):
            print("no build yet: run python build_lib.py", file=sys.stderr)
            return 1
    started = time.monotonic()
    try:
        flags = cmake_flags(args)
        key = build_key(flags)
        build = cache / "build" / key
        targets = ["llama", *RPC_TARGETS, *MEDIA_TARGETS, *CHAT_TARGETS,
                   *(SERVER_TARGETS if args.with_server else ())]
        record_path = build / "build.json"
        done = json.loads(record_path.read_text()) if record_path.exists() else {}
        missing = [t for t in targets if t not in done.get("targets", [])]
        if not missing and is_complete(build, done, shim_key(build, key)):
            phase(f"up to date (key {key}); library in {lib_dir_of(build)}")
            write_current(build, key, flags, done["targets"])
            byte_compile_package()
            return 0
        src = extract_source(cache, fetch_sdist(cache))
        if missing:
            build_library(src, build, flags, args.jobs, targets)
        generate_binding(src, build)
        all_targets = sorted(set(done.get("targets", [])) | set(targets))
        record_path.write_text(json.dumps({"key": key, "flags": flags, "targets": all_targets,
                                           "shim": shim_key(build, key)}))
        write_current(build, key, flags, all_targets)
        byte_compile_package()
    except StepError as exc:
        phase(f"FAILED: {exc}")
        return 1
    phase(f"done in {time.monotonic() - started:.0f}s; library in {lib_dir_of(build)}")
    return 0


def byte_compile_package() -> None:
    """Write the bytecode of the ``llamapy`` package beside its sources: an editable install
    does not, nor does Python when ``PYTHONDONTWRITEBYTECODE`` is set, and every start of the
    server would compile its modules again (a tenth of a second and more). Python checks each
    file's source against its bytecode, so a later edit is never shadowed."""
    import compileall

    package = Path(__file__).resolve().parent / "llamapy"
    if not compileall.compile_dir(package, quiet=2, workers=0):
        phase("bytecode: some modules did not compile (the server compiles them at start)")


def is_complete(build: Path, done: dict[str, object], shim: str) -> bool:
    """Whether the binding, the layout probe and the shim of ``build`` are current."""
    return (done.get("shim") == shim and (build / "_llama_ffi.py").exists()
            and (build / "layout.json").exists()
            and (lib_dir_of(build) / SHIM_LIBRARY).exists())


def generate_binding(src: Path, build: Path) -> None:
    """Steps 4 to 6: the cffi module, the shim and the layout probe (seconds, no CMake)."""
    phase("binding: generating cffi declarations from the pinned headers and the shim's")
    cdef = preprocess_headers(src, build)
    write_ffi_module(cdef, build)
    phase(f"shim: compiling {SHIM_SOURCE.name} against the library")
    build_shim(src, build)
    phase("layout probe: recording sizeof/offsetof of every llama_* and mtmd_* struct")
    run_layout_probe(src, build, cdef)


def write_current(build: Path, key: str, flags: list[str], targets: list[str]) -> None:
    record = {"key": key, "build_dir": str(build), "lib_dir": str(lib_dir_of(build)),
              "flags": flags, "targets": targets}
    current_build_file().parent.mkdir(parents=True, exist_ok=True)
    current_build_file().write_text(json.dumps(record, indent=1))
    built = build / "_llama_ffi.py"
    if built.exists() and (not FFI_MODULE.exists() or FFI_MODULE.read_text() != built.read_text()):
        FFI_MODULE.write_text(built.read_text())  # this checkout's copy follows the build


if __name__ == "__main__":
    sys.exit(main())
