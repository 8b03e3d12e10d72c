"""Images in a workspace session's volatile suffix, on the fake backend and its fake projector:
the suffix's media is decoded with it, a suffix that sends the same image again reuses its KV,
another image does not, decoding continues after it, and a host without a projector refuses
media with a typed error."""

from __future__ import annotations

from dataclasses import replace

import pytest
from session_fakes import fake_manifest, fake_tokenize, make_engine

from llamapy.engine.engine import Engine
from llamapy.errors import InvalidOptionError, MediaError
from llamapy.media import FakeMediaEncoder
from llamapy.media.samples import png
from llamapy.session import DecodeConfig, InlineHost, PrefixInput, Session, SessionConfig
from llamapy.session.config import SuffixInput

PREFIX = tuple(range(2, 40))
RED, BLUE = png(3, 3, (255, 0, 0)), png(3, 3, (0, 0, 255))


def media_session(engine: Engine, *, projector: bool = True) -> Session:
    media = FakeMediaEncoder(lambda text, special, _parse: fake_tokenize(text, special)) \
        if projector else None
    host = InlineHost(engine, fake_manifest(), tokenize=fake_tokenize, media=media)
    return Session(host, SessionConfig(lease_timeout=0.5, request_timeout=5.0))


def suffix(image: bytes, text: str = "look: <__media__> what?") -> SuffixInput:
    return SuffixInput(text=text, media=(image,))


def answer(session: Session, n: int = 6) -> list[int]:
    """The tokens a decode of at most ``n`` adds to the resident state."""
    before = len(session.resident)
    chunks = list(session.decode(DecodeConfig(max_tokens=n, temperature=0.8, seed=3)))
    assert all(c.error is None for c in chunks)
    return session.resident[before:]


def reference(engine: Engine, prompt: list[int], n: int) -> list[int]:
    params = replace(engine.config.sampling, temp=0.8, seed=3)
    return engine.backend.model.reference(prompt, n, params)  # type: ignore[attr-defined]


def test_an_image_in_the_suffix_is_decoded_and_reused() -> None:
    engine = make_engine()
    with media_session(engine) as s:
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        first = s.prefill_suffix(suffix(RED))
        assert first.reused_tokens == 0 and first.prefilled_tokens == first.suffix_tokens
        resident = list(s.resident)
        assert any(t < 0 for t in resident)  # the image's rows
        assert answer(s) == reference(engine, resident, 6)
        again = s.prefill_suffix(suffix(RED))
        assert again.reused_tokens == again.suffix_tokens  # every row, the image's included
        other = s.prefill_suffix(suffix(BLUE))
        assert other.reused_tokens < other.suffix_tokens - 2
        resident = list(s.resident)
        assert answer(s) == reference(engine, resident, 6)
    assert not engine.backend.violations  # type: ignore[attr-defined]


def test_media_needs_a_projector_and_text_after_it() -> None:
    engine = make_engine()
    with media_session(engine, projector=False) as s:
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        with pytest.raises(MediaError, match="mmproj"):
            s.prefill_suffix(suffix(RED))
    with media_session(engine) as s:
        s.ensure_prefix(PrefixInput(token_ids=PREFIX))
        s.prefill_suffix(suffix(RED, "look: <__media__>"))  # ends with the image
        stream = s.decode(DecodeConfig(max_tokens=2))
        chunks = list(stream)
        assert chunks and isinstance(chunks[-1].error, InvalidOptionError)
        with pytest.raises(InvalidOptionError):
            SuffixInput(token_ids=(2, 3), media=(RED,))
        with pytest.raises(InvalidOptionError):
            SuffixInput(text="x", media=("not bytes",))  # type: ignore[arg-type]
