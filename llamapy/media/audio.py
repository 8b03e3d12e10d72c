"""Audio read in Python, bounded, before libmtmd sees it.

libmtmd's own reader sizes its sample buffer from what a file's header claims (a 42-byte FLAC
can claim hours), so llamapy never hands it an audio file: :func:`wav_samples` reads PCM WAV
with the standard library, checks its rate, channels, sample width and duration against the
file's real length and the request's limit, mixes it to mono and resamples it (linearly) to the
projector's rate; the projector gets the float samples. MP3 and FLAC are refused (send WAV).
"""

from __future__ import annotations

import io
import wave
from typing import TYPE_CHECKING

from llamapy.errors import MediaError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MIN_SECONDS", "wav_decoded_bytes", "wav_samples"]

#: The shortest clip taken (libmtmd needs more than one sample; a tenth of a second is the
#: least a projector makes anything of).
MIN_SECONDS = 0.1
_RATES = (8000, 192000)
_DTYPES = {1: "u1", 2: "<i2", 4: "<i4"}


def wav_samples(data: bytes, rate: int, max_seconds: float) -> np.ndarray:
    """The mono float32 samples of a PCM WAV file, at ``rate``; a
    :class:`~llamapy.errors.MediaError` for anything else, or a clip shorter than
    :data:`MIN_SECONDS` or longer than ``max_seconds``."""
    import numpy as np

    try:
        with wave.open(io.BytesIO(data), "rb") as reader:
            channels, width, source = (reader.getnchannels(), reader.getsampwidth(),
                                       reader.getframerate())
            _check_format(channels, width, source)
            declared = reader.getnframes()
            if declared > max_seconds * source:
                raise _too_long(declared / source, max_seconds)
            frames = reader.readframes(declared)
    except MediaError:
        raise
    except (wave.Error, EOFError, ValueError) as exc:
        raise MediaError(f"audio: not a PCM WAV file this server reads ({exc})",
                         reason="format") from None
    n = len(frames) // (channels * width)
    if n < MIN_SECONDS * source:
        raise MediaError(f"audio: a clip of {n / source:.3f} s is shorter than {MIN_SECONDS} s",
                         reason="format")
    samples = _floats(frames[:n * channels * width], width).reshape(n, channels).mean(axis=1)
    if source != rate:
        at = np.arange(int(n * rate / source)) * (source / rate)
        samples = np.interp(at, np.arange(n), samples)
    out: np.ndarray = samples.astype(np.float32)
    return out


def wav_decoded_bytes(data: bytes, rate: int) -> int:
    """About the most :func:`wav_samples` holds reading ``data`` for ``rate``, from the WAV
    header alone (no sample is read): the float64 working copies of its frames (each channel's
    and the mono mix: 8 bytes a sample) and of the resampled clip, and the float32 samples at
    ``rate`` (12 bytes a sample in all); 0 for a header it cannot read (then
    :func:`wav_samples` refuses the file before reading any frame)."""
    try:
        with wave.open(io.BytesIO(data), "rb") as reader:
            channels, source = reader.getnchannels(), reader.getframerate()
            frames = min(reader.getnframes(), len(data) // max(1, channels
                                                                * reader.getsampwidth()))
    except (wave.Error, EOFError, ValueError):
        return 0
    if source <= 0:
        return 0
    return 8 * frames * (max(1, channels) + 1) + 12 * (frames * rate // source + 1)


def _check_format(channels: int, width: int, rate: int) -> None:
    if not 1 <= channels <= 8 or width not in (*_DTYPES, 3) \
            or not _RATES[0] <= rate <= _RATES[1]:
        raise MediaError(f"audio: {channels} channels of {8 * width}-bit samples at {rate} Hz "
                         f"is not a format this server reads", reason="format")


def _too_long(seconds: float, max_seconds: float) -> MediaError:
    return MediaError(f"audio: a clip of {seconds:.1f} s is longer than the {max_seconds:g} s "
                      "allowed", reason="too_large")


def _floats(frames: bytes, width: int) -> np.ndarray:
    """Interleaved samples as floats in [-1, 1)."""
    import numpy as np

    if width == 3:  # 24-bit: widen each sample to 32 bits
        raw = np.frombuffer(frames, dtype=np.uint8).reshape(-1, 3)
        wide = np.zeros((len(raw), 4), dtype=np.uint8)
        wide[:, 1:] = raw
        return wide.view("<i4").reshape(-1).astype(np.float64) / 2.0**31
    values = np.frombuffer(frames, dtype=_DTYPES[width]).astype(np.float64)
    if width == 1:
        return (values - 128.0) / 128.0
    return values / 2.0 ** (8 * width - 1)
