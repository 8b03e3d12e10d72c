"""``ContextOverflowError.overflow_detail()``: the counts as a frozen value, and the HTTP error
body carries exactly its ``as_dict()``."""

from __future__ import annotations

import dataclasses

import pytest

from llamapy.errors import ContextOverflowDetail, ContextOverflowError


def overflow() -> ContextOverflowError:
    return ContextOverflowError(stage="ensure_prefix", resident_tokens=3000,
                                additional_tokens=1500, n_ctx=4096)


def test_overflow_detail_is_a_frozen_value_of_the_counts() -> None:
    detail = overflow().overflow_detail()
    assert detail == ContextOverflowDetail(stage="ensure_prefix", resident_tokens=3000,
                                           additional_tokens=1500, n_ctx=4096)
    assert (detail.n_prompt_tokens, detail.excess_tokens) == (4500, 404)
    with pytest.raises(dataclasses.FrozenInstanceError):
        detail.n_ctx = 8192  # type: ignore[misc]
    assert detail.as_dict() == {"stage": "ensure_prefix", "resident_tokens": 3000,
                                "additional_tokens": 1500, "n_ctx": 4096,
                                "n_prompt_tokens": 4500}


def test_the_http_error_body_carries_the_overflow_detail() -> None:
    errors = pytest.importorskip("llamapy.serve.errors")
    exc = overflow()
    status, body = errors.error_body(exc)
    assert status == 400
    error = body["error"]
    assert {k: error[k] for k in exc.overflow_detail().as_dict()} == exc.overflow_detail().as_dict()
    assert set(error) == {"message", "type", "param", "code", *exc.overflow_detail().as_dict()}
