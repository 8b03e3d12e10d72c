"""The sampler chain follows ``samplers`` (llama-server's order, names, aliases and letters)."""

from __future__ import annotations

import pytest

from llamapy.engine.options import SamplingParams
from llamapy.errors import InvalidOptionError
from llamapy.llama_backend import build_chain
from llamapy.options.samplers import DEFAULT_SAMPLERS

ALL_ON = {"penalty_repeat": 1.1, "dry_multiplier": 0.5, "top_n_sigma": 2.0, "top_k": 40,
          "typical_p": 0.9, "top_p": 0.9, "min_p": 0.05, "xtc_probability": 0.1, "temp": 0.8}


def names(model, **kw) -> list[str]:
    chain = build_chain(model, SamplingParams(seed=1, **kw))
    try:
        return chain.names
    finally:
        chain.close()


def test_the_default_order_is_llama_servers(model) -> None:
    assert SamplingParams().samplers == DEFAULT_SAMPLERS
    assert names(model, **ALL_ON) == ["penalties", "dry", "top_n_sigma", "top_k", "typical",
                                      "top_p", "min_p", "xtc", "temp", "dist"]


@pytest.mark.parametrize("samplers", [("temperature", "top_k"), ["Temp", "top-k"], "tk",
                                      ["temperature;topk"]])
def test_names_aliases_and_letters_order_the_chain(model, samplers) -> None:
    assert names(model, samplers=samplers, **ALL_ON) == ["temp", "top_k", "dist"]


def test_greedy_keeps_the_listed_penalties_only(model) -> None:
    assert names(model, **{**ALL_ON, "temp": 0.0}) == ["penalties", "dry", "greedy"]
    assert names(model, samplers="kt", **{**ALL_ON, "temp": 0.0}) == ["greedy"]


@pytest.mark.parametrize(("samplers", "message"), [
    (["top_k", "nope"], "sampler name 'nope' is unknown"), ("kq", "sampler code 'q'"),
    (["infill"], "'infill' is not built here"), (7, "list of names or a string")])
def test_unknown_samplers_are_refused(samplers, message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        SamplingParams(samplers=samplers)
