"""Unit tests of the HTTP layer's pure parts (no model): request mapping, errors, flags."""

from __future__ import annotations

import argparse
import math
from types import MappingProxyType

import pytest

from llamapy.engine import RequestTimings
from llamapy.errors import (
    ContextOverflowError,
    InvalidOptionError,
    LlamapyError,
    ModelNotFoundError,
    QueueFullError,
    TenantBusyError,
    UnknownOptionError,
    UnsupportedFeatureError,
)
from llamapy.openai_api.params import (
    ENGINE_ALIASES,
    SERVER_ONLY,
    ChatBody,
    CompletionBody,
    check_unsupported,
    choice_seed,
    engine_extras,
    logit_bias,
    parse_body,
    sampling_options,
)
from llamapy.openai_api.report import diverged_at, finish_reason, timings_dict
from llamapy.serve.cli import build_parser
from llamapy.serve.context import cache_headers
from llamapy.serve.errors import error_body, error_headers
from llamapy.serve.flags.start import option_specs, shown_default, start_options
from llamapy.server import server_request_option_keys, start_option_keys

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def test_openai_fields_map_to_engine_options() -> None:
    body = parse_body(ChatBody, {
        "messages": MESSAGES, "temperature": 0.5, "top_p": 0.9, "seed": 7, "stop": "END",
        "presence_penalty": 0.1, "frequency_penalty": 0.2, "logit_bias": {"15": -100},
        "top_k": 5, "min_p": 0.1, "repeat_penalty": 1.1, "cache_prompt": False,
        "cache_scope": "tenant", "session": "conv-1", "grammar": 'root ::= "x"',
    })
    options = sampling_options(body)
    assert options == {
        "temp": 0.5, "top_p": 0.9, "seed": 7, "stop": ["END"], "penalty_present": 0.1,
        "penalty_freq": 0.2, "logit_bias": {15: -100.0}, "top_k": 5, "min_p": 0.1,
        "penalty_repeat": 1.1, "cache_prompt": False, "cache_scope": "tenant",
        "session": "conv-1", "grammar": 'root ::= "x"',
    }
    assert set(options) <= set(server_request_option_keys())


def test_every_engine_request_option_is_accepted_as_an_extra() -> None:
    for key in server_request_option_keys():
        if key in SERVER_ONLY:
            with pytest.raises(InvalidOptionError, match="cannot be set over HTTP"):
                engine_extras({key: 1})
            continue
        assert key in engine_extras({key: {} if key == "logit_bias" else 1})
    for alias, name in ENGINE_ALIASES.items():
        assert name in server_request_option_keys()
        assert name in engine_extras({alias: 1})
    assert engine_extras({"top_k": None}) == {}


def test_unknown_field_is_rejected_by_name() -> None:
    with pytest.raises(UnknownOptionError) as info:
        sampling_options(parse_body(ChatBody, {"messages": MESSAGES, "temprature": 1}))
    assert info.value.option == "temprature"
    assert info.value.http_status == 400


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({"messages": MESSAGES, "temperature": 3}, "temperature"),
    ({"messages": MESSAGES, "max_tokens": -1}, "max_tokens"),
    ({"messages": MESSAGES, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": MESSAGES, "tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": MESSAGES, "response_format": {"type": "yaml"}}, "response_format.type"),
    ({}, "messages"),
])
def test_invalid_bodies_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(InvalidOptionError) as info:
        parse_body(ChatBody, body)
    assert info.value.option == param


def test_body_must_be_an_object() -> None:
    with pytest.raises(InvalidOptionError):
        parse_body(ChatBody, [1, 2])


def test_streamed_n_best_of_and_suffix_are_rejected_clearly() -> None:
    with pytest.raises(UnsupportedFeatureError, match="stream to false"):
        check_unsupported(parse_body(CompletionBody, {"prompt": "hi", "n": 2, "stream": True}))
    check_unsupported(parse_body(ChatBody, {"messages": MESSAGES, "n": 2, "stream": True}))
    check_unsupported(parse_body(ChatBody, {"messages": MESSAGES, "n": 2}))
    with pytest.raises(InvalidOptionError, match="'n'"):
        parse_body(ChatBody, {"messages": MESSAGES, "n": 129})
    with pytest.raises(UnsupportedFeatureError, match="best_of"):
        check_unsupported(parse_body(CompletionBody, {"prompt": "x", "best_of": 3}))
    with pytest.raises(UnsupportedFeatureError, match="suffix"):
        check_unsupported(parse_body(CompletionBody, {"prompt": "x", "suffix": "y"}))


def test_choice_seeds_offset_a_fixed_seed_and_keep_a_random_one() -> None:
    assert [choice_seed(7, i) for i in range(3)] == [7, 8, 9]
    assert [choice_seed(-1, i) for i in range(2)] == [-1, -1]
    assert [choice_seed(2**32 - 1, i) for i in range(2)] == [2**32 - 1] * 2  # random too


def test_logit_bias_forms() -> None:
    assert logit_bias({"1": 2, "3": False}) == {1: 2.0, 3: -math.inf}
    assert logit_bias([[1, -1.5], [2, False]]) == {1: -1.5, 2: -math.inf}
    assert logit_bias([["Hello", -1.0]]) == {"Hello": -1.0}  # text: tokenized later
    assert logit_bias({"Hello": 2}) == {"Hello": 2.0}
    for bad in ({"1": math.inf}, {"1": math.nan}, {"1": 101}, {"1": True}, {"1": "x"},
                [[1, 2, 3]], [1], [[None, 1]], "x"):
        with pytest.raises(InvalidOptionError, match="logit_bias"):
            logit_bias(bad)


def test_errors_map_by_type_to_the_openai_shape() -> None:
    status, body = error_body(ContextOverflowError(stage="admit", resident_tokens=0,
                                                   additional_tokens=5000, n_ctx=4096))
    assert status == 400
    error = body["error"]
    assert error["code"] == "context_length_exceeded"
    assert (error["additional_tokens"], error["n_ctx"]) == (5000, 4096)
    assert (error["type"], error["n_prompt_tokens"]) == ("exceed_context_size_error", 5000)
    assert set(error) >= {"message", "type", "param", "code"}
    assert error_body(ModelNotFoundError("nope"))[0] == 404
    status, body = error_body(QueueFullError(4))
    assert (status, body["error"]["type"]) == (429, "rate_limit_error")
    assert error_headers(QueueFullError(4)) == {"Retry-After": "1"}
    status, body = error_body(TenantBusyError("t", 3))  # a full queue for one tenant
    assert (status, body["error"]["type"], body["error"]["code"]) == \
        (429, "rate_limit_error", "rate_limit_exceeded")
    assert "tenant_max_requests=3" in body["error"]["message"]
    assert error_headers(TenantBusyError(None, 3)) == {"Retry-After": "1"}
    status, body = error_body(RuntimeError("boom"))
    assert (status, body["error"]["type"]) == (500, "server_error")
    # the status comes from the class, whatever the message says
    assert error_body(LlamapyError("queue is full, context overflow, 404"))[0] == 500


def test_finish_reasons() -> None:
    assert finish_reason("eog") == "stop"
    assert finish_reason("stop") == "stop"
    assert finish_reason("max_tokens") == "length"
    assert finish_reason("eog", tool_calls=True) == "tool_calls"


def test_cache_explanation() -> None:
    partial = RequestTimings(prompt_tokens=100, reused_tokens=40, reuse_source="donor")
    assert diverged_at(partial) == 40
    full = RequestTimings(prompt_tokens=100, reused_tokens=99, reuse_source="own")
    assert diverged_at(full) is None
    timings = timings_dict(partial)
    assert (timings["cache_n"], timings["cache_source"]) == (40, "donor")
    headers = cache_headers(timings)
    assert headers["X-Llamapy-Cache-Tokens"] == "40"
    assert headers["X-Llamapy-Cache-Source"] == "donor"
    assert headers["X-Llamapy-Cache-Diverged-At"] == "40"


def test_every_start_option_has_a_flag() -> None:
    parser = build_parser()
    text = parser.format_help()
    for key in start_option_keys():
        if key == "model_path":
            continue
        assert "--" + key.replace("_", "-") in text, key
    for flag in ("--model", "--alias", "--host", "--port", "--api-key", "--cors-origin",
                 "--log-level", "--chat-template", "--threads", "--no-cache-prompt",
                 "--no-kv-unified", "-c INT", "--ctx-size", "-np", "-ngl", "-kvu", "-no-kvu",
                 "-fa", "--cache-ram", "--cors-origins", "--n-predict", "--no-webui",
                 "--no-slots", "--no-metrics", "--jinja", "--verbose", "--embeddings",
                 "--chat-template-file", "--reasoning-format", "--context-embeddings"):
        assert flag in text, flag
    assert all((action.help or "").strip() for action in parser._actions)


def test_every_start_option_flag_has_help_and_a_readable_default() -> None:
    parser = build_parser()
    text = parser.format_help()
    assert "mappingproxy" not in text and "--no-no-" not in text
    actions = {a.dest: a for a in parser._actions}
    for key in start_option_keys():
        assert key in actions, key
        assert (actions[key].help or "").strip(), key
    assert "(default: {})" in " ".join(actions["logit_bias"].help.split())
    assert "--perf, --no-perf" in text
    assert start_options(parser.parse_args(["--perf"])) == {"no_perf": False}
    assert start_options(parser.parse_args(["--no-perf"])) == {"no_perf": True}
    assert (shown_default(MappingProxyType({})), shown_default(("a", "b")), shown_default(()),
            shown_default(True), shown_default(False), shown_default(0.5)) == \
        ("{}", "a,b", "none", "on", "off", "0.5")
    assert shown_default(("\n", ",")) == '["\\n", ","]'  # not comma-separable: JSON


def test_flags_parse_to_start_options() -> None:
    parser = build_parser()
    args = parser.parse_args(["--n-ctx", "1024", "--no-kv-unified", "--threads", "2",
                              "--batch-strategy", "balanced", "--tensor-split", "0.5,0.5",
                              "--logit-bias", '{"5": -1}', "--flash-attn", "off"])
    assert start_options(args) == {
        "n_ctx": 1024, "kv_unified": False, "n_threads": 2, "batch_strategy": "balanced",
        "tensor_split": (0.5, 0.5), "logit_bias": {5: -1}, "flash_attn": False,
    }
    assert start_options(parser.parse_args([])) == {}
    assert {spec.name for spec in option_specs()} == set(start_option_keys()) - {"model_path"}
    assert isinstance(parser, argparse.ArgumentParser)


def test_serving_enables_the_ram_prompt_cache_by_default() -> None:
    """``python -m llamapy.serve`` sizes the RAM prompt cache from free memory (llama-server
    keeps one by default too); ``--cache-ram`` / ``--prompt-cache-ram-mb`` override it and 0
    turns it off. The library ``Server`` keeps the seed's default of 0."""
    from llamapy.options import EngineConfig
    from llamapy.serve.flags.start import serve_cache_ram_mb, serve_start_options

    parser = build_parser()
    default = serve_start_options(parser.parse_args([]))["prompt_cache_ram_mb"]
    assert default == serve_cache_ram_mb() and 0 < default <= 8192
    assert serve_start_options(parser.parse_args(["--cache-ram", "0"]))[
        "prompt_cache_ram_mb"] == 0
    assert serve_start_options(parser.parse_args(["--prompt-cache-ram-mb", "64"]))[
        "prompt_cache_ram_mb"] == 64
    assert "prompt_cache_ram_mb" not in start_options(parser.parse_args([]))
    assert EngineConfig().prompt_cache_ram_mb == 0
    assert "quarter of available memory" in parser.format_help()


LLAMA_SERVER_SPELLINGS = [
    (["-c", "1024"], {"n_ctx": 1024}), (["--ctx-size", "1024"], {"n_ctx": 1024}),
    (["-np", "3"], {"n_parallel": 3}), (["--parallel", "3"], {"n_parallel": 3}),
    (["-t", "2"], {"n_threads": 2}), (["--threads", "2"], {"n_threads": 2}),
    (["-tb", "3"], {"n_threads_batch": 3}), (["--threads-batch", "3"], {"n_threads_batch": 3}),
    (["-b", "256"], {"n_batch": 256}), (["--batch-size", "256"], {"n_batch": 256}),
    (["-ub", "128"], {"n_ubatch": 128}), (["--ubatch-size", "128"], {"n_ubatch": 128}),
    (["-ngl", "7"], {"n_gpu_layers": 7}), (["--gpu-layers", "7"], {"n_gpu_layers": 7}),
    (["--n-gpu-layers", "7"], {"n_gpu_layers": 7}),
    (["--temp", "0.7"], {"temp": 0.7}), (["--temperature", "0.7"], {"temp": 0.7}),
    (["--seed", "42"], {"seed": 42}), (["-s", "42"], {"seed": 42}),
    (["-kvu"], {"kv_unified": True}), (["--kv-unified"], {"kv_unified": True}),
    (["-no-kvu"], {"kv_unified": False}), (["--no-kv-unified"], {"kv_unified": False}),
    (["-ctk", "q8_0"], {"type_k": "q8_0"}), (["--cache-type-k", "q8_0"], {"type_k": "q8_0"}),
    (["-ctv", "q4_0"], {"type_v": "q4_0"}), (["--cache-type-v", "q4_0"], {"type_v": "q4_0"}),
    (["-fa", "on"], {"flash_attn": True}), (["-fa", "off"], {"flash_attn": False}),
    (["-fa", "auto"], {"flash_attn": "auto"}), (["--flash-attn", "on"], {"flash_attn": True}),
    (["-cram", "64"], {"prompt_cache_ram_mb": 64}),
    (["--pooling", "mean"], {"pooling_type": "mean"}),
]


@pytest.mark.parametrize(("argv", "expected"), LLAMA_SERVER_SPELLINGS)
def test_llama_server_spellings_parse_to_start_options(argv: list[str], expected: dict) -> None:
    assert start_options(build_parser().parse_args(argv)) == expected


def test_llama_server_option_values_start_the_server_options() -> None:
    from llamapy.options import resolve_start_options

    args = build_parser().parse_args(["-c", "1024", "-np", "2", "-b", "256", "-ub", "64",
                                      "-fa", "off", "-no-kvu", "-ctk", "q8_0", "-t", "2"])
    start = resolve_start_options("m.gguf", start_options(args))
    assert (start.server.n_ctx, start.server.n_parallel, start.context.n_seq_max) == (1024, 2, 2)
    assert (start.context.n_batch, start.context.n_ubatch, start.context.n_threads) == (256, 64, 2)
    assert (start.context.flash_attn, start.context.kv_unified, start.engine.kv_unified) == (
        False, False, False)
    assert start.context.type_k == "q8_0"


def test_cache_ram_minus_one_is_no_limit_and_other_negatives_are_refused() -> None:
    from llamapy.options import resolve_start_options
    from llamapy.serve.flags.start import serve_start_options, unlimited_cache_ram_mb

    parser = build_parser()
    unlimited = serve_start_options(parser.parse_args(["--cache-ram", "-1"]))
    assert unlimited["prompt_cache_ram_mb"] == unlimited_cache_ram_mb() > 8192
    refused = serve_start_options(parser.parse_args(["--cache-ram", "-2"]))
    with pytest.raises(InvalidOptionError, match="prompt_cache_ram_mb"):
        resolve_start_options("m.gguf", refused)


def test_an_unknown_flag_is_still_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--ctx-sise", "5"], ["-kvx"], ["--n-parralel", "2"]):
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(argv)
        assert exc.value.code == 2
        assert "unrecognized arguments" in capsys.readouterr().err


def test_disk_cache_flags_derive_from_the_option_names():
    parser = build_parser()
    options = start_options(parser.parse_args(["--prompt-cache-dir", "/tmp/kv",
                                               "--prompt-cache-disk-mb", "512"]))
    assert options == {"prompt_cache_dir": "/tmp/kv", "prompt_cache_disk_mb": 512.0}
    assert "prompt_cache_dir" not in start_options(parser.parse_args([]))


def _disk_engine_stats(folder) -> dict:
    """The stats of a fake-backend engine that wrote a prefix to disk and restored it."""
    from llamapy.engine import Engine, EngineConfig, EngineTuning, FakeBackend, Request
    from llamapy.engine.cache.disk import CacheNamespace
    from llamapy.engine.options import RequestOptions
    from llamapy.engine.testing import drain

    engine = Engine(FakeBackend(n_ctx=512, n_seq_max=1),
                    EngineConfig(n_parallel=1, prompt_cache_dir=str(folder)),
                    tuning=EngineTuning(disk_min_tokens=8, disk_background=False),
                    cache_namespace=CacheNamespace("fake"))
    a, b = [1 + i % 60 for i in range(60)], [1 + (7 * i) % 61 for i in range(60)]
    for rid, prompt in enumerate([a, b, [*a, 5]]):
        engine.submit(Request(rid, prompt, RequestOptions(max_tokens=2)))
        drain(engine)
    return engine.stats().as_dict()


def test_metrics_export_the_disk_cache(tmp_path):
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from llamapy.serve.metrics.registry import EngineCollector

    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: _disk_engine_stats(tmp_path)))
    text = generate_latest(registry).decode()
    for name in ("llamapy_disk_writes_total 2.0", "llamapy_disk_restores_total 1.0",
                 "llamapy_disk_failures_total 0.0",
                 'llamapy_reused_tokens_total{source="disk"} 60.0',
                 "llamapy_disk_cache_entries", "llamapy_disk_cache_bytes",
                 "llamapy_disk_cache_budget_bytes", "llamapy_disk_cache_evictions_total",
                 "llamapy_disk_cache_bad_files_total"):
        assert name in text, name
