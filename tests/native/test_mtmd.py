"""libmtmd's binding on the real model and the tiny projector: the projector loads and reports
what it takes, an image becomes its chunks, a bad file is a typed error, audio samples make an
audio bitmap, the structs libmtmd passes by value have the layout cffi assumes, and an encode
leaves no native threads behind on the thread that asked for it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from llamapy._native import Model
from llamapy._native._loader import layout_file, native
from llamapy._native.mtmd import Projector
from llamapy.errors import ClosedError, MediaError
from llamapy.media.samples import png
from llamapy.models import default_model_path
from llamapy.testing import tiny_mmproj_path

#: Bound on waiting for ended threads to leave the process (a bound, not a speed figure).
WAIT_S = 10.0


@pytest.fixture(scope="module")
def projector() -> Iterator[Projector]:
    with Model(default_model_path()) as model, \
            Projector(tiny_mmproj_path(), model, use_gpu=False, n_threads=1) as proj:
        yield proj


def test_mtmd_structs_are_layout_checked() -> None:
    layout = json.loads(layout_file(native().lib_path).read_text())
    assert {"mtmd_context_params", "mtmd_input_text", "mtmd_helper_bitmap_wrapper"} <= set(layout)


def test_an_image_becomes_text_and_image_chunks(projector: Projector) -> None:
    assert (projector.supports_vision, projector.supports_audio) == (True, False)
    assert projector.width == 576 and projector.marker == "<__media__>"
    with projector.bitmap(png(20, 20)) as bitmap:
        assert bitmap.size == (20, 20) and not bitmap.is_audio
        with projector.tokenize("a <__media__> b", [bitmap]) as chunks:
            kinds = [c.kind for c in chunks.items]
            assert kinds == ["text", "image", "text"]
            image = chunks.items[1]
            assert (image.n_tokens, image.non_causal) == (16, False)
            rows = np.frombuffer(chunks.encode(1), dtype=np.float32).reshape(16, 576)
            assert np.isfinite(rows).all()


def test_bad_input_is_typed(projector: Projector) -> None:
    with pytest.raises(MediaError):
        projector.bitmap(png(4, 4)[:30])  # a PNG cut inside its header
    with projector.bitmap(png(4, 4)) as bitmap, pytest.raises(MediaError):
        projector.tokenize("no marker here", [bitmap])
    bitmap = projector.bitmap(png(2, 2))
    bitmap.close()
    with pytest.raises(ClosedError):
        projector.tokenize("<__media__>", [bitmap])


def test_audio_samples_make_an_audio_bitmap(projector: Projector) -> None:
    samples = np.sin(np.arange(1600, dtype=np.float32) / 10)
    with projector.audio_bitmap(samples) as bitmap:
        assert bitmap.is_audio and bitmap.size[0] == 1600
        with pytest.raises(MediaError):  # this projector takes no audio
            projector.tokenize("<__media__>", [bitmap])
    with pytest.raises(MediaError):
        projector.audio_bitmap(np.zeros(1, dtype=np.float32))


def native_threads() -> int:
    """The process's threads, native ones included (Linux)."""
    return len(os.listdir("/proc/self/task"))


def encode_image(projector: Projector) -> bytes:
    with projector.bitmap(png(20, 20)) as bitmap, \
            projector.tokenize("a <__media__> b", [bitmap]) as chunks:
        return chunks.encode(1)


def test_an_encode_leaves_no_threads_behind(projector: Projector) -> None:
    """An HTTP worker thread encodes an image and lives on: once the encode returns, the
    process has no more threads than before it. (ggml computes in an OpenMP team of the
    calling thread; libgomp keeps the team's workers while that thread lives, and while it
    keeps more threads than there are CPUs, every barrier of every team sleeps instead of
    spinning: each decode after the first image was 1.5 times slower on two idle cores.)"""
    with Projector(tiny_mmproj_path(), projector.model, use_gpu=False, n_threads=2) as proj, \
            ThreadPoolExecutor(1) as worker:
        worker.submit(native_threads).result()  # the worker thread is up
        idle = native_threads()
        for _ in range(2):
            rows = worker.submit(encode_image, proj).result()
            assert len(rows) == 16 * proj.width * 4
            deadline = time.monotonic() + WAIT_S
            while native_threads() > idle:  # an ended thread leaves the process soon after
                assert time.monotonic() < deadline, f"{native_threads() - idle} threads kept"
                time.sleep(0.01)
