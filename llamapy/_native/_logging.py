"""Route llama.cpp / ggml log output to :mod:`logging` (logger ``llamapy.llama_cpp``).

llama.cpp logs a lot at INFO while loading; those lines go to DEBUG so the default logging
configuration stays quiet. Warnings and errors keep their level. :func:`capture` collects the
lines logged on the current thread during a call, so a failing call (a bad grammar, a corrupt
file) can put llama.cpp's own message into the exception it raises.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("llamapy.llama_cpp")

_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
_CONT = 5
_local = threading.local()
_callback: Any = None  # keeps the cffi callback alive for the life of the process


def _on_log(level: int, text: Any, _user_data: Any) -> None:
    ffi = _ffi
    message = ffi.string(text).decode("utf-8", "replace") if text != ffi.NULL else ""
    if level == _CONT:
        level = getattr(_local, "last_level", 2)
    _local.last_level = level
    sink = getattr(_local, "capture", None)
    if sink is not None and level >= 3:
        sink.append(message.strip())
    line = message.rstrip("\n")
    if line:
        log.log(_LEVELS.get(level, logging.DEBUG), "%s", line)


_ffi: Any = None


def install(ffi: Any, lib: Any) -> None:
    """Install the log callback (once per process)."""
    global _callback, _ffi
    if _callback is not None:
        return
    _ffi = ffi
    _callback = ffi.callback("ggml_log_callback", _on_log)
    lib.llama_log_set(_callback, ffi.NULL)


def install_media(lib: Any) -> None:
    """Route libmtmd's log (its own and its vision encoder's) through the same callback."""
    assert _callback is not None and _ffi is not None, "install() runs when libllama loads"
    lib.mtmd_helper_log_set(_callback, _ffi.NULL)


@contextlib.contextmanager
def capture() -> Iterator[list[str]]:
    """Collect warning/error lines llama.cpp logs on this thread inside the block."""
    previous = getattr(_local, "capture", None)
    lines: list[str] = []
    _local.capture = lines
    try:
        yield lines
    finally:
        _local.capture = previous


#: The GIL switch interval inside :func:`loud_call` (seconds; Python's default is 0.005).
LOUD_SWITCH_INTERVAL = 2e-5
_loud_lock = threading.Lock()
_loud_calls = 0
_saved_interval = 0.005


@contextlib.contextmanager
def loud_call() -> Iterator[list[str]]:
    """:func:`capture` around a native call that logs hundreds of lines (a model load, a
    context creation). Each line is a callback that must take the GIL; while another Python
    thread is busy (the HTTP stack importing during a start) the holder gives it up only every
    switch interval, 5 ms, so such a call took twice its time. Inside the block (any thread;
    nested or concurrent blocks count) the interval is :data:`LOUD_SWITCH_INTERVAL`."""
    global _loud_calls, _saved_interval
    with _loud_lock:
        if _loud_calls == 0:
            _saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(LOUD_SWITCH_INTERVAL)
        _loud_calls += 1
    try:
        with capture() as lines:
            yield lines
    finally:
        with _loud_lock:
            _loud_calls -= 1
            if _loud_calls == 0:
                sys.setswitchinterval(_saved_interval)


def captured_message(lines: list[str], fallback: str) -> str:
    """A one-line message from captured log lines, or ``fallback`` when none were logged."""
    text = "; ".join(line for line in lines if line)
    return text or fallback


_stderr_lock = threading.Lock()


@contextlib.contextmanager
def capture_stderr() -> Iterator[list[str]]:
    """Collect what native code writes straight to file descriptor 2 inside the block.

    A few llama.cpp paths (the GBNF parser) ``fprintf(stderr, ...)`` instead of logging; this
    is how their message reaches the exception. Serialised by a lock; the window is one call.
    """
    import os
    import sys
    import tempfile

    lines: list[str] = []
    with _stderr_lock, tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode("utf-8", "replace").splitlines())
