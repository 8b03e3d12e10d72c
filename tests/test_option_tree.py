"""The option tree (``llamapy.options``): one name, one default, one help text per option.

Fast (no model): defaults that every layer shares agree, timeouts come from ``Timeouts``,
``vocab_only`` / ``n_seq_max`` / ``model_path`` never reach a server, the load mode collapse,
the alias table and the standalone-session knobs.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import llamapy.options
from llamapy.errors import InvalidOptionError, UnknownOptionError
from llamapy.options import (
    ALIASES,
    REASONING_FORMATS,
    SERVE_OPTION_NAMES,
    START_OPTION_OWNERS,
    TIMEOUTS,
    ContextOptions,
    EngineConfig,
    EngineTuning,
    ModelOptions,
    RequestOptions,
    ServeOptions,
    ServerOptions,
    Timeouts,
    aliases_of,
    field_help,
    resolve_start_options,
    start_option_keys,
)
from llamapy.options.model import (
    LOAD_MODE_DIRECT_IO,
    LOAD_MODE_MLOCK,
    LOAD_MODE_MMAP,
    LOAD_MODE_MMAP_MLOCK,
    LOAD_MODE_NONE,
)
from llamapy.session.config import (
    DecodeConfig,
    SessionConfig,
    check_shared,
    decode_sampling,
    standalone_context_options,
)

TREE = Path(llamapy.options.__file__).parent


def _defaults(cls: type) -> dict[str, object]:
    return {f.name: f.default for f in dataclasses.fields(cls)}


# --- one default per name -------------------------------------------------------------------


def test_server_sizing_defaults() -> None:
    start = resolve_start_options("m.gguf", {})
    assert (start.server.n_ctx, start.context.n_ctx) == (8192, 8192)
    assert start.server.effective_n_batch == start.context.n_batch == start.engine.n_batch == 2048
    assert start.server.n_parallel == start.engine.n_parallel == start.context.n_seq_max == 4
    assert start.engine.kv_unified is start.context.kv_unified is True
    for n_ctx, n_batch in ((1024, 1024), (2048, 2048), (4096, 2048), (32768, 2048)):
        start = resolve_start_options("m.gguf", {"n_ctx": n_ctx})
        assert start.context.n_batch == start.engine.n_batch == n_batch == min(n_ctx, 2048)
    start = resolve_start_options("m.gguf", {"n_ctx": 4096, "n_batch": 512, "n_parallel": 2})
    assert (start.context.n_batch, start.engine.n_batch, start.context.n_seq_max) == (512, 512, 2)


def test_defaults_agree_across_the_tree() -> None:
    server, context, engine = _defaults(ServerOptions), ContextOptions(), EngineConfig()
    assert context.n_ctx == server["n_ctx"] == llamapy.options.N_CTX == 8192
    assert context.effective_n_batch == engine.n_batch == 2048
    assert ServerOptions(model_path="m").effective_n_batch == context.effective_n_batch
    assert context.n_seq_max == engine.n_parallel == server["n_parallel"] == 4
    assert context.kv_unified is engine.kv_unified is llamapy.options.KV_UNIFIED is True
    assert ContextOptions(n_ctx=512).effective_n_batch == 512


def test_n_gpu_layers_defaults_to_99() -> None:
    assert ModelOptions().n_gpu_layers == 99
    assert resolve_start_options("m.gguf", {}).model.n_gpu_layers == 99


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("mlock", [False, True])
@pytest.mark.parametrize("direct", [False, True])
def test_load_mode_collapse(mmap: bool, mlock: bool, direct: bool) -> None:
    mode = ModelOptions(use_mmap=mmap, use_mlock=mlock, use_direct_io=direct).load_mode
    if direct:
        assert mode == LOAD_MODE_DIRECT_IO  # direct I/O wins outright
    else:
        expected = {(False, False): LOAD_MODE_NONE, (True, False): LOAD_MODE_MMAP,
                    (False, True): LOAD_MODE_MLOCK, (True, True): LOAD_MODE_MMAP_MLOCK}
        assert mode == expected[mmap, mlock]


# --- timeouts -------------------------------------------------------------------------------


def test_timeouts_have_one_default_each() -> None:
    assert (TIMEOUTS.call, TIMEOUTS.stream_chunk, TIMEOUTS.lease, TIMEOUTS.session_event,
            TIMEOUTS.http_request) == (60.0, 30.0, 30.0, 120.0, 600.0)
    with pytest.raises(InvalidOptionError):
        Timeouts(call=0)


def test_every_consumer_reads_its_timeout_from_the_tree() -> None:
    from llamapy.openai_api.target import DEFAULT_REQUEST_TIMEOUT, ServedModel
    from llamapy.serve.app import create_app
    from llamapy.serve.cli import build_parser
    from llamapy.server.options import DEFAULT_CALL_TIMEOUT, DEFAULT_STREAM_TIMEOUT

    assert TIMEOUTS.call == DEFAULT_CALL_TIMEOUT
    assert TIMEOUTS.stream_chunk == DEFAULT_STREAM_TIMEOUT
    assert SessionConfig().lease_timeout == TIMEOUTS.lease
    assert SessionConfig().request_timeout == TIMEOUTS.session_event
    assert TIMEOUTS.http_request == DEFAULT_REQUEST_TIMEOUT
    served_default = {f.name: f.default for f in dataclasses.fields(ServedModel)}
    assert served_default["request_timeout"] == TIMEOUTS.http_request
    assert inspect.signature(create_app).parameters["request_timeout"].default == \
        TIMEOUTS.http_request
    assert build_parser().parse_args([]).request_timeout == TIMEOUTS.http_request


# --- what a server never takes ----------------------------------------------------------------


@pytest.mark.parametrize("key", ["vocab_only", "n_seq_max", "model_path"])
def test_not_a_start_option(key: str) -> None:
    assert key not in start_option_keys()
    with pytest.raises(UnknownOptionError) as info:
        resolve_start_options("m.gguf", {key: 1})
    assert info.value.option == key


def test_server_refuses_vocab_only_before_starting_a_thread() -> None:
    from llamapy.server import Server

    before = set(threading.enumerate())
    with pytest.raises(UnknownOptionError):
        Server("missing.gguf", vocab_only=True)
    assert set(threading.enumerate()) == before
    assert "vocab_only" in {f.name for f in dataclasses.fields(ModelOptions)}  # Model takes it


# --- help texts and flags ---------------------------------------------------------------------


def test_every_option_field_has_a_help_text() -> None:
    owners = [cls for cls, _ in START_OPTION_OWNERS]
    for cls in [*owners, RequestOptions, EngineTuning, Timeouts]:
        for f in dataclasses.fields(cls):
            assert field_help(f).strip(), f"{cls.__name__}.{f.name} has no help"


def test_every_start_option_has_one_owner() -> None:
    owned = {f.name for cls, _ in START_OPTION_OWNERS for f in dataclasses.fields(cls)}
    assert set(start_option_keys()) <= owned


# --- aliases and reasoning formats ------------------------------------------------------------


def test_alias_table_is_read_by_every_consumer() -> None:
    from llamapy.openai_api import llama_compat, params, render
    from llamapy.session import config

    assert {a: n for a, n in ALIASES.items() if n != "max_tokens"} == params.ENGINE_ALIASES
    assert params.engine_extras({"typ_p": 0.5, "repeat_last_n": 8}) == \
        {"typical_p": 0.5, "penalty_last_n": 8}
    assert set(aliases_of("max_tokens")) == {"n_predict", "max_completion_tokens"}
    assert llama_compat.BUDGET_FIELDS[0] == "n_predict"
    assert render.check_reasoning_format is llamapy.options.check_reasoning_format
    assert config.REASONING_FORMATS is REASONING_FORMATS


def test_decode_config_maps_onto_sampling_params_through_the_aliases() -> None:
    assert decode_sampling(DecodeConfig()) == {}
    cfg = DecodeConfig(temperature=0.3, top_p=0.5, top_k=5, seed=7, max_tokens=9)
    assert decode_sampling(cfg) == {"temp": 0.3, "top_p": 0.5, "top_k": 5, "seed": 7}
    for fmt in REASONING_FORMATS:
        assert DecodeConfig(reasoning_format=fmt).reasoning_format == fmt


# --- session knobs ----------------------------------------------------------------------------


def test_standalone_context_uses_the_tree_defaults() -> None:
    opts = standalone_context_options(SessionConfig())
    assert (opts.n_ctx, opts.n_batch, opts.n_seq_max, opts.kv_unified) == (8192, 2048, 1, True)
    opts = standalone_context_options(SessionConfig(n_ctx=1024, context_options={
        "type_k": "q8_0", "n_ubatch": 64}))
    assert (opts.n_ctx, opts.n_batch, opts.type_k, opts.n_ubatch) == (1024, 1024, "q8_0", 64)
    assert standalone_context_options(SessionConfig(n_ctx=1024, n_batch=256)).n_ubatch == 256


@pytest.mark.parametrize("key", ["n_ctx", "n_batch", "n_seq_max", "kv_unified"])
def test_context_options_may_not_size_the_context(key: str) -> None:
    with pytest.raises(InvalidOptionError) as info:
        standalone_context_options(SessionConfig(context_options={key: 1}))
    assert info.value.option == key


def test_unknown_context_option_is_typed() -> None:
    with pytest.raises(UnknownOptionError) as info:
        standalone_context_options(SessionConfig(context_options={"n_ctxx": 1}))
    assert info.value.option == "n_ctxx"


@pytest.mark.parametrize("knob, value", [("n_ctx", 1024), ("n_batch", 64),
                                         ("context_options", {"type_k": "q8_0"})])
def test_shared_session_refuses_context_knobs(knob: str, value: object) -> None:
    check_shared(SessionConfig(cache_scope="x"))
    with pytest.raises(InvalidOptionError) as info:
        check_shared(SessionConfig(**{knob: value}))  # type: ignore[arg-type]
    assert info.value.option == knob and knob in str(info.value)


def test_session_config_validates_its_knobs() -> None:
    for bad in ({"n_ctx": 0}, {"n_batch": -1}, {"n_ctx": 1.5}, {"context_options": 3}):
        with pytest.raises(InvalidOptionError):
            SessionConfig(**bad)  # type: ignore[arg-type]


# --- layering ---------------------------------------------------------------------------------


def _top_level_imports(path: Path) -> list[str]:
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append(node.module or "")
    return found


def test_the_tree_imports_only_the_stdlib_and_errors() -> None:
    files = sorted(TREE.glob("*.py"))
    assert len(files) >= 8
    for path in files:
        for module in _top_level_imports(path):
            top = module.split(".")[0]
            ok = (top in sys.stdlib_module_names or module == "__future__"
                  or module == "llamapy.errors" or module.startswith("llamapy.options"))
            assert ok, (path.name, module)


def test_importing_the_tree_loads_no_native_code_and_no_engine() -> None:
    code = ("import sys, llamapy.options\n"
            "bad = [m for m in sys.modules if m == 'cffi' or m.startswith(('llamapy._native', "
            "'llamapy.engine', 'llamapy.server', 'numpy'))]\n"
            "assert not bad, bad\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_max_tokens_and_cache_scope_have_one_default() -> None:
    # The session's configs take them from the tree (an API field left unset means "the
    # server's": ServedModel.intent resolves it), so changing the tree changes all.
    tree = RequestOptions()
    assert DecodeConfig().max_tokens == tree.max_tokens
    assert SessionConfig().cache_scope == tree.cache_scope


def test_serving_options_have_one_default() -> None:
    # ServeOptions in the tree: create_app's keywords, a served model's fields, the one-model
    # host's and the flags of python -m llamapy.serve all take their defaults from it.
    from llamapy.openai_api import ServedModel
    from llamapy.serve import create_app
    from llamapy.serve.cli import build_parser
    from llamapy.serve.flags.serving import app_options, serve_options
    from llamapy.serve.host import ModelHost

    tree = ServeOptions()
    args = build_parser().parse_args([])
    assert serve_options(args) == tree  # every flag's default, read as its option
    from_flags = {**vars(args), **app_options(args)}  # (host and port go to uvicorn)
    fields = {f.name: f.default for f in dataclasses.fields(ServedModel)}
    app = inspect.signature(create_app).parameters
    host = inspect.signature(ModelHost).parameters
    for name in SERVE_OPTION_NAMES:
        expected = getattr(tree, name)
        assert from_flags[name] == expected, name
        if name in fields:
            assert fields[name] == expected, name
        for keywords in (app, host):
            if name in keywords:
                assert keywords[name].default == expected, name
    by_name = {"alias", "api_key", "cors_origins", "allowed_hosts", "max_body_bytes",
               "request_timeout"}  # create_app's own keywords among the serving options
    assert by_name <= set(SERVE_OPTION_NAMES) and by_name <= set(app)
    assert {"aliases", "tags"} <= set(fields) and "sleep_idle_seconds" in host
    with pytest.raises(InvalidOptionError, match="cache_report"):
        ServeOptions(cache_report="loud")


#: Serving options whose flag stores elsewhere: its destination, and its value as the option.
_FLAG_DESTS = {"embeddings": ("embeddings_endpoint", lambda on: on),
               "max_body_bytes": ("max_body_mb", lambda mb: int(mb * 2**20))}


def test_every_serving_option_has_a_flag_with_the_trees_default_and_help() -> None:
    from llamapy.options.serve import REASONING_SWITCHES
    from llamapy.serve.cli import build_parser
    from llamapy.serve.flags.serving import REASONING_SWITCH

    parser = build_parser()
    first: dict[str, argparse.Action] = {}
    for action in parser._actions:  # argparse takes a destination's default from its first
        first.setdefault(action.dest, action)
    parsed = vars(parser.parse_args([]))
    for name in SERVE_OPTION_NAMES:
        if name == "aliases":  # no flag of its own: -a/--alias names after the first
            continue
        dest, as_option = _FLAG_DESTS.get(name, (name, lambda value: value))
        assert as_option(parsed[dest]) == getattr(ServeOptions(), name), name
        if name != "embeddings":  # its flag is --no-embeddings-endpoint, "disable ..."
            assert field_help(_serve_field(name)) in (first[dest].help or ""), name
    assert tuple(REASONING_SWITCH) == REASONING_SWITCHES


def _serve_field(name: str) -> dataclasses.Field[object]:
    return next(f for f in dataclasses.fields(ServeOptions) if f.name == name)


@pytest.mark.parametrize("bad", [
    {"max_body_bytes": -1}, {"max_body_bytes": 0}, {"max_body_bytes": 1.5},
    {"reasoning": "maybe"}, {"log_level": "loud"}, {"log_colors": "rainbow"},
    {"sleep_idle_seconds": float("nan")}, {"ssl_key_file": "key.pem"},
    {"ssl_cert_file": "cert.pem"}, {"tags": "a,b"}, {"cors_origins": [1]}, {"alias": 3},
    {"api_key": 0}, {"api_key_file": 0}, {"log_file": 0}, {"allowed_hosts": None}])
def test_the_tree_refuses_a_bad_serving_value(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidOptionError) as info:
        ServeOptions(**bad)  # type: ignore[arg-type]
    assert info.value.option in (*bad, "ssl_key_file")  # half of TLS is named by its key



def test_a_bad_body_limit_is_refused_at_every_edge(capsys: pytest.CaptureFixture[str]) -> None:
    from llamapy.serve import create_app
    from llamapy.serve.__main__ import main
    from llamapy.serve.cli import build_parser
    from llamapy.serve.flags.serving import serve_options

    with pytest.raises(InvalidOptionError) as info:
        create_app(lambda: None, max_body_bytes=-1)  # type: ignore[arg-type, return-value]
    assert info.value.option == "max_body_bytes"
    for mb in ("-1", "0", "nan", "inf"):
        with pytest.raises(InvalidOptionError):
            serve_options(build_parser().parse_args(["--max-body-mb", mb]))
    assert main(["--model", "/nonexistent/model.gguf", "--max-body-mb", "-1"]) == 2
    assert "max_body_bytes" in capsys.readouterr().err
    assert serve_options(build_parser().parse_args(["--max-body-mb", "0.5"])).max_body_bytes \
        == 2**19
