"""The pins in llamapy/_pins.py and third_party/README.md agree."""

from __future__ import annotations

from pathlib import Path

from llamapy._pins import DEFAULT_MODEL, LLAMA_CPP_COMMIT, LLAMA_CPP_SOURCE, SECOND_MODEL

README = Path(__file__).resolve().parents[1] / "third_party" / "README.md"


def test_third_party_readme_matches_pins() -> None:
    text = README.read_text()
    for pin in (LLAMA_CPP_SOURCE, DEFAULT_MODEL, *SECOND_MODEL.parts):
        assert pin.requirement in text
        assert pin.sha256 in text
        assert pin.filename in text
    assert DEFAULT_MODEL.member_sha256 in text
    assert LLAMA_CPP_COMMIT in text
    assert SECOND_MODEL.sha256 in text and SECOND_MODEL.name in text
    assert all(part.member in text for part in SECOND_MODEL.parts)
