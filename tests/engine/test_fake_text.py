"""``FakeTextModel``: a byte tokenizer consistent with the fake backend's pieces."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llamapy.engine.fake.backend import FakeBackend
from llamapy.engine.fake.model import N_BYTE_TOKENS, FakeModel
from llamapy.engine.fake.text import END_OF_TURN, FakeTextModel
from llamapy.engine.options import SamplingParams

MODEL = FakeTextModel()


@given(st.text())
def test_detokenize_inverts_tokenize(text: str) -> None:
    assert MODEL.detokenize(MODEL.tokenize(text, parse_special=True), unparse_special=True) \
        == text
    assert MODEL.detokenize(MODEL.tokenize(text)) == text


def test_the_end_of_turn_text_is_one_token_only_when_parsing_special() -> None:
    assert MODEL.tokenize(f"a{END_OF_TURN}", parse_special=True) == \
        [*MODEL.tokenize("a"), MODEL.eos]
    assert MODEL.eos not in MODEL.tokenize(END_OF_TURN)
    assert MODEL.token_to_piece(MODEL.eos, special=False) == b""


def test_pieces_are_the_fake_backends() -> None:
    backend = FakeBackend(model=MODEL.fake)
    for token in range(1, MODEL.n_vocab):
        assert MODEL.token_to_piece(token) == backend.token_to_piece(token)


@given(st.lists(st.integers(0, MODEL.n_vocab - 1), max_size=30), st.integers(0, 2**32 - 1))
def test_generation_never_draws_a_byte_token(prompt: list[int], seed: int) -> None:
    tokens = MODEL.fake.reference(prompt, 40, SamplingParams(seed=seed, temp=0.8))
    assert all(t < MODEL.n_vocab - N_BYTE_TOKENS for t in tokens)


def test_ids_outside_the_vocabulary_raise() -> None:
    for token in (-1, MODEL.n_vocab):
        with pytest.raises(IndexError):
            MODEL.token_to_piece(token)


def test_top_logprobs_stop_at_the_vocabulary() -> None:
    model = FakeModel(n_vocab=8)
    assert len(model.top_logprobs(12345, 2**32)) == 8
