"""An image in a workspace session's volatile suffix on the real model (SmolLM2-135M with the
tiny generated projector: arbitrary weights, so this proves plumbing and reuse, not sight):
the image is decoded with the suffix, a suffix that sends it again reuses every row, the answer
is the same, and the session goes on decoding after it."""

from __future__ import annotations

from pathlib import Path

from llamapy.media.samples import png
from llamapy.server import Server
from llamapy.session import DecodeConfig, PrefixInput, SessionConfig
from llamapy.session.config import SuffixInput
from llamapy.testing import tiny_mmproj_path

SYSTEM = "<|im_start|>system\nYou describe images briefly.<|im_end|>\n"
TURN = "<|im_start|>user\n<__media__>\nWhat is this?<|im_end|>\n<|im_start|>assistant\n"


def test_a_session_suffix_with_an_image(model_path: Path) -> None:
    image = png(24, 24, (30, 160, 90))
    with Server(model_path, mmproj=str(tiny_mmproj_path()), n_ctx=2048, n_parallel=2,
                n_threads=1) as server:
        server.wait_ready(60)
        with server.open_session(SessionConfig()) as session:
            session.ensure_prefix(PrefixInput(text=SYSTEM))
            first = session.prefill_suffix(SuffixInput(text=TURN, media=(image,)))
            assert first.suffix_tokens >= 16 and first.reused_tokens == 0
            greedy = DecodeConfig(max_tokens=6, temperature=0.0)
            text = "".join(c.text for c in session.decode(greedy))
            again = session.prefill_suffix(SuffixInput(text=TURN, media=(image,)))
            assert again.reused_tokens == again.suffix_tokens
            assert "".join(c.text for c in session.decode(greedy)) == text
            chunks = list(session.decode(DecodeConfig(max_tokens=3)))  # after the answer
            assert all(c.error is None for c in chunks)
            assert 6 < session.explain_context().generated_tokens <= 9
