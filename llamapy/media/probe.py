"""What a media item is, read from its first bytes, before any decoder sees it.

libmtmd decodes images with stb_image and audio with miniaudio, and hands anything else to a
video probe that starts ``ffprobe``. A request's bytes must never get that far unchecked, and an
image's pixel count (what decoding it costs in memory: 3 bytes a pixel, more while it is
preprocessed) must be known before it is decoded: a few kilobytes of PNG can claim a 60,000 x
60,000 canvas. :func:`probe` reads the kind, the format and, for images, the size from the
header, and refuses every format it does not know.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

from llamapy.errors import MediaError

__all__ = ["IMAGE_FORMATS", "MediaInfo", "probe"]

#: The image formats read (their headers give the size): stb_image decodes each.
IMAGE_FORMATS = ("png", "jpeg", "gif", "bmp")
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE,
                       0xCF})


@dataclass(frozen=True, slots=True)
class MediaInfo:
    """``kind`` (``"image"`` or ``"audio"``), ``format`` and, for an image, its size."""

    kind: str
    format: str
    width: int = 0
    height: int = 0

    @property
    def pixels(self) -> int:
        """``width * height`` (0 for audio)."""
        return self.width * self.height


def probe(data: bytes) -> MediaInfo:
    """The kind, format and size of ``data``; :class:`~llamapy.errors.MediaError` (reason
    ``"format"``) for anything but PNG, JPEG, GIF, BMP and WAV, or a header that does not hold
    together."""
    head = data[:16]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return _png(data)
    if head.startswith(b"\xff\xd8\xff"):
        return _jpeg(data)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        width, height = _unpack("<HH", data, 6, "gif")
        return _image("gif", width, height)
    if head.startswith(b"BM"):
        width, height = _unpack("<ii", data, 18, "bmp")
        return _image("bmp", width, abs(height))
    if head.startswith(b"RIFF") and head[8:12] == b"WAVE":
        return MediaInfo("audio", "wav")
    if head.startswith(b"fLaC") or head.startswith(b"ID3") or (
            len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        raise MediaError("unsupported audio: MP3 and FLAC are not read here; send PCM WAV",
                         reason="format")
    raise MediaError("unsupported media: send a PNG, JPEG, GIF or BMP image, or PCM WAV audio",
                     reason="format")


def _unpack(fmt: str, data: bytes, at: int, name: str) -> tuple[Any, ...]:
    size = struct.calcsize(fmt)
    if len(data) < at + size:
        raise MediaError(f"truncated {name} header", reason="format")
    return struct.unpack_from(fmt, data, at)


def _image(name: str, width: int, height: int) -> MediaInfo:
    if width <= 0 or height <= 0:
        raise MediaError(f"{name} image of size {width}x{height}", reason="format")
    return MediaInfo("image", name, width, height)


def _png(data: bytes) -> MediaInfo:
    length, tag = _unpack(">I4s", data, 8, "png")
    if tag != b"IHDR" or length < 13:
        raise MediaError("png without its IHDR header", reason="format")
    width, height, depth, color = _unpack(">IIBB", data, 16, "png")
    info = _image("png", width, height)
    channels = _PNG_CHANNELS.get(color, 4)
    row = (width * channels * depth + 7) // 8 + 1
    _check_inflated(data, height * row + 14 * height + 64)
    return info


#: Samples per pixel of each PNG colour type.
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def _check_inflated(data: bytes, bound: int) -> None:
    """Refuse a PNG whose image data inflates past ``bound`` bytes (what its header's size
    allows, interlacing included): stb_image inflates all of it whatever the header says, so
    a megabyte of zeros would cost a gigabyte. Inflated a megabyte at a time and dropped."""
    inflater, total, at = zlib.decompressobj(), 0, 8
    while at + 8 <= len(data):
        (length, tag), body = _unpack(">I4s", data, at, "png"), at + 8
        if tag == b"IDAT":
            chunk = data[body:body + length]
            while chunk:
                try:
                    total += len(inflater.decompress(chunk, 1 << 20))
                except zlib.error:
                    raise MediaError("png image data does not inflate", reason="format") from None
                if total > bound:
                    raise MediaError("png image data inflates past its size: refused",
                                     reason="too_large")
                chunk = inflater.unconsumed_tail
        elif tag == b"IEND":
            return
        at = body + length + 4


#: The most scans a JPEG may have (a progressive one has about ten): stb_image decodes each,
#: so thousands of empty scans are a small file that costs minutes of CPU.
MAX_JPEG_SCANS = 64


def _jpeg(data: bytes) -> MediaInfo:
    """The size from the first start-of-frame segment (walking the segments' lengths), once
    the file's start-of-scan markers are counted (an entropy-coded 0xFF is stuffed, so the
    marker's two bytes stand only where a scan or a segment's payload has them)."""
    if data.count(b"\xff\xda") > MAX_JPEG_SCANS:
        raise MediaError(f"jpeg with more than {MAX_JPEG_SCANS} scans: refused",
                         reason="too_large")
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            break
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # segments without a length
            at += 2
            continue
        (length,) = _unpack(">H", data, at + 2, "jpeg")
        if marker in _JPEG_SOF:
            height, width = _unpack(">HH", data, at + 5, "jpeg")
            return _image("jpeg", width, height)
        if length < 2:
            break
        at += 2 + length
    raise MediaError("jpeg without a readable frame header", reason="format")
