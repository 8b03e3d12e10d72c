"""Option dataclasses: llama-server defaults, derived keys, unknown and invalid options."""

from __future__ import annotations

import dataclasses

import pytest

from llamapy.engine import (
    LLAMA_DEFAULT_SEED,
    EngineConfig,
    RequestOptions,
    SamplingParams,
    engine_option_keys,
    make_engine_config,
    request_option_keys,
    resolve_request_options,
    sampling_option_keys,
)
from llamapy.errors import InvalidOptionError, UnknownOptionError


def test_sampling_defaults_match_llama_server():
    p = SamplingParams()
    assert (p.temp, p.top_k, p.top_p, p.min_p, p.typical_p) == (0.8, 40, 0.95, 0.05, 1.0)
    assert (p.seed, p.native_seed) == (-1, LLAMA_DEFAULT_SEED)
    assert (p.penalty_repeat, p.penalty_freq, p.penalty_present, p.penalty_last_n) == \
        (1.0, 0.0, 0.0, 64)
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == \
        (0.0, 1.75, 2, -1)
    assert p.dry_sequence_breakers == ("\n", ":", '"', "*")
    assert (p.top_n_sigma, p.xtc_probability, p.xtc_threshold) == (-1.0, 0.0, 0.1)
    assert (p.dynatemp_range, p.dynatemp_exponent) == (0.0, 1.0)
    assert (p.mirostat, p.mirostat_tau, p.mirostat_eta) == (0, 5.0, 0.1)
    assert (dict(p.logit_bias), p.grammar, p.grammar_root, p.n_probs) == ({}, "", "root", 0)


def test_request_and_engine_defaults():
    r = RequestOptions()
    assert (r.max_tokens, r.cache_prompt, r.session, r.cache_scope, r.stop, r.adapters) == \
        (256, None, None, None, (), ())
    c = EngineConfig()
    assert (c.n_parallel, c.n_batch, c.chunk_size, c.max_queue) == (4, 2048, 512, 64)
    assert (c.cache_prompt, c.kv_unified, c.prompt_cache_ram_mb) == (True, True, 0)
    assert c.batch_strategy == "shortest_first"


def test_keys_derive_from_the_dataclasses():
    sampling = {f.name for f in dataclasses.fields(SamplingParams)}
    assert set(sampling_option_keys()) == sampling
    assert set(request_option_keys()) == sampling | {
        "max_tokens", "cache_prompt", "session", "cache_scope", "tenant", "cache_salt",
        "adapters", "stop", "speculative", "timings_per_token", "return_progress", "slot_id",
        "cache_pins", "preserved_tokens"}
    assert set(engine_option_keys()) >= sampling | {"n_parallel", "max_queue", "batch_strategy"}
    assert "sampling" not in request_option_keys() + engine_option_keys()


def test_options_are_frozen_slotted_kw_only():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingParams().temp = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        SamplingParams(0.5)  # type: ignore[misc]
    assert not hasattr(RequestOptions(), "__dict__")


def test_resolve_merges_server_defaults_with_overrides():
    defaults = SamplingParams(temp=0.1, top_k=5)
    opts = resolve_request_options({"top_k": 7, "max_tokens": 3, "stop": "END"},
                                   defaults=defaults)
    assert (opts.sampling.temp, opts.sampling.top_k, opts.max_tokens) == (0.1, 7, 3)
    assert opts.stop == ("END",)


def test_unknown_option_names_the_valid_keys():
    with pytest.raises(UnknownOptionError) as info:
        resolve_request_options({"temperature": 0.2})
    assert info.value.unknown == ["temperature"] and "temp" in info.value.valid
    assert "valid keys are" in str(info.value)
    with pytest.raises(UnknownOptionError):
        make_engine_config({"n_parralel": 2})


@pytest.mark.parametrize("bad", [
    {"top_k": 1.5}, {"top_p": 2.0}, {"temp": "hot"}, {"seed": -2}, {"mirostat": 3},
    {"n_probs": -1}, {"logit_bias": {"a": 1.0}}, {"dry_sequence_breakers": "ab"},
    {"max_tokens": -1}, {"stop": [""]}, {"cache_prompt": "yes"}, {"cache_scope": 3},
    {"session": []}, {"adapters": "a.gguf"}, {"adapters": [{"path": "a"}]}, {"adapters": 3},
])
def test_invalid_values_raise_typed_errors(bad):
    with pytest.raises(InvalidOptionError) as info:
        resolve_request_options(bad)
    assert info.value.option == next(iter(bad))


@pytest.mark.parametrize("bad", [
    {"n_parallel": 0}, {"n_batch": 0}, {"chunk_size": 0}, {"max_queue": -1},
    {"prompt_cache_ram_mb": -1}, {"batch_strategy": "fastest"}, {"batch_strategy": 42},
])
def test_invalid_engine_config(bad):
    with pytest.raises(InvalidOptionError) as info:
        make_engine_config(bad)
    assert info.value.option == next(iter(bad))


def test_logit_bias_is_copied_and_read_only():
    bias = {3: -1.0}
    p = SamplingParams(logit_bias=bias)
    bias[4] = 1.0
    assert dict(p.logit_bias) == {3: -1.0}
    with pytest.raises(TypeError):
        p.logit_bias[5] = 0.0  # type: ignore[index]


def test_engine_config_ram_budget_in_bytes():
    assert EngineConfig(prompt_cache_ram_mb=2).prompt_cache_ram_bytes == 2 * 1024 * 1024
