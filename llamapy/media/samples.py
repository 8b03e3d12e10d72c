"""Small media files made in code, for tests and examples: :func:`png` (a solid-colour RGB
PNG) and :func:`wav` (a mono 16-bit sine tone). Standard library only."""

from __future__ import annotations

import math
import struct
import zlib

__all__ = ["png", "wav"]


def png(width: int, height: int, rgb: tuple[int, int, int] = (255, 0, 0)) -> bytes:
    """A ``width`` x ``height`` PNG of one colour."""
    row = b"\x00" + bytes(rgb) * width
    raw = row * height

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data)))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))


def wav(seconds: float = 0.5, rate: int = 16000, hz: float = 440.0) -> bytes:
    """A mono 16-bit PCM WAV of a sine tone."""
    n = int(seconds * rate)
    samples = b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * hz * i / rate)))
                       for i in range(n))
    fmt = struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, 1, rate, rate * 2, 2, 16)
    data = struct.pack("<4sI", b"data", len(samples)) + samples
    return struct.pack("<4sI4s", b"RIFF", 4 + len(fmt) + len(data), b"WAVE") + fmt + data
