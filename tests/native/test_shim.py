"""llamapy's shim on the real model: each wrapper's error path ends in its typed error, and the
chain or context it failed on leaves the process (and the context) working.

Without the shim each of these calls ends the process: a C++ exception through cffi is
``std::terminate``, and the first test's greedy case is ``GGML_ABORT`` in llama.cpp's grammar.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from capped_child import LINUX_ONLY, run_capped

from llamapy._native import Batch, Context, Model, SamplerChain, native
from llamapy._native._loader import SHIM_ABI, load_shim
from llamapy._native._shim import WHAT_SIZE, Status, check_error
from llamapy.errors import (
    DecodeAbortedError,
    DecodeError,
    DecodeExceptionError,
    GrammarError,
    LibraryNotFoundError,
    NativeError,
    NativeExceptionError,
    NativeMemoryError,
    NoCandidateError,
)
from llamapy.greedy import greedy_pick_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ctx(model: Model) -> Iterator[Context]:
    with Context(model, n_ctx=256, n_batch=64, n_threads=2) as c:
        yield c


@pytest.fixture()
def row(model: Model, ctx: Context) -> int:
    """The output row of a fresh prompt decoded on sequence 0."""
    ctx.clear()
    batch = Batch(64)
    index = batch.add(0, 0, model.tokenize("Say x or y:"))
    ctx.decode(batch)
    return index


def token(model: Model, text: str) -> int:
    (only,) = model.tokenize(text, add_special=False)
    return only


@pytest.mark.parametrize("sampled", [False, True])
def test_a_grammar_that_the_bias_leaves_no_token_fails_the_sample(
        model: Model, ctx: Context, row: int, sampled: bool) -> None:
    """The issue's request: ``root ::= "x"`` with "x" biased away. llama.cpp picks an excluded
    token and accepts it: greedy picks token 0, an end-of-generation token, and the grammar
    calls GGML_ABORT; sampling picks the last token and the grammar throws."""
    with SamplerChain(model) as chain:
        chain.add_grammar('root ::= "x"').add_logit_bias({token(model, "x"): float("-inf")})
        if sampled:
            chain.add_temp(0.8).add_dist(7)
        else:
            chain.add_greedy()
        with pytest.raises(NoCandidateError, match="no token is left"):
            chain.sample(ctx, row)
        with pytest.raises(NativeError, match="failed earlier"):  # the chain is failed
            chain.sample(ctx, row)
    with SamplerChain(model).add_grammar('root ::= "x"').add_greedy() as chain:
        assert chain.sample(ctx, row) == token(model, "x")  # the context samples on


def test_a_bias_that_leaves_no_token_fails_the_fast_greedy_pick_too(
        model: Model, ctx: Context, row: int) -> None:
    """Greedy after a logit bias is picked in Python (:mod:`llamapy.greedy`): it refuses what
    the native chain refuses."""
    banned = dict.fromkeys(range(model.n_vocab), float("-inf"))
    pick = greedy_pick_for(["logit_bias", "greedy"], banned, model.n_vocab)
    assert pick is not None
    with pytest.raises(NoCandidateError):
        pick(ctx.logits(row))
    chain = SamplerChain(model).add_logit_bias(banned).add_greedy()
    with chain, pytest.raises(NoCandidateError):
        chain.sample(ctx, row)


def test_a_row_without_logits_is_a_typed_error(model: Model, ctx: Context, row: int) -> None:
    with SamplerChain(model).add_greedy() as chain, pytest.raises(NativeError, match="logits"):
        chain.sample(ctx, row + 1000)


def test_accepting_a_token_the_grammar_rejects_is_a_typed_error(model: Model) -> None:
    with SamplerChain(model).add_grammar('root ::= "x"') as chain:
        with pytest.raises(NativeExceptionError, match="empty grammar stack") as caught:
            chain.accept(token(model, "y"))
        assert caught.value.function == "llama_sampler_accept"
        with pytest.raises(NativeError, match="failed earlier"):
            chain.accept(token(model, "x"))


def test_apply_with_a_token_outside_the_vocabulary_is_a_typed_error(model: Model) -> None:
    """The grammar looks every candidate up with ``std::vector::at``."""
    ffi, shim = native().ffi, native().shim
    data = ffi.new("llama_token_data[]", 2)
    data[0].id, data[1].id = token(model, "x"), model.n_vocab + 5
    cur_p = ffi.new("llama_token_data_array *", {"data": data, "size": 2, "selected": -1})
    what = ffi.new("char[]", WHAT_SIZE)
    with SamplerChain(model).add_grammar('root ::= "x"') as chain:
        status = shim.llamapy_sampler_apply(chain.ptr, cur_p, what, WHAT_SIZE)
        assert status == Status.EXCEPTION
        with pytest.raises(NativeExceptionError, match="range") as caught:
            check_error(status, what, "llama_sampler_apply")
    assert caught.value.function == "llama_sampler_apply"


def test_a_replayed_token_the_grammar_refuses_is_a_typed_error(model: Model) -> None:
    """The grammar throws on a token it cannot read; the chain stays as it was."""
    with SamplerChain(model) as chain:
        token = model.tokenize("z")[-1]
        with pytest.raises(NativeExceptionError, match="grammar"):
            chain.add_grammar('root ::= "x"', replay=[token])
        assert chain.add_greedy().names == ["greedy"]


@pytest.mark.parametrize(("kind", "status"), [(0, Status.OK), (1, Status.EXCEPTION),
                                              (2, Status.NO_MEMORY), (3, Status.UNKNOWN)])
def test_the_guard_maps_every_exception_kind(kind: int, status: Status) -> None:
    ffi, shim = native().ffi, native().shim
    what = ffi.new("char[]", WHAT_SIZE)
    assert shim.llamapy_shim_selftest(kind, what, WHAT_SIZE) == status
    expected: dict[str, type[Exception]] = {
        "llama_sampler_init_grammar": GrammarError, "llama_sampler_sample": NativeExceptionError,
        "llama_decode": DecodeExceptionError}
    if status == Status.NO_MEMORY:
        expected["llama_sampler_sample"] = NativeMemoryError
        expected["llama_sampler_init_grammar"] = NativeMemoryError
    for function, error in expected.items():
        if status == Status.OK:
            check_error(status, what, function)
            continue
        with pytest.raises(error) as caught:
            check_error(status, what, function)
        assert type(caught.value) is error


def test_a_decode_that_throws_fails_like_a_fatal_decode_code() -> None:
    """The executor fails a batch on any ``DecodeError``; a thrown decode is one."""
    error = DecodeExceptionError("boom")
    assert isinstance(error, DecodeError) and error.code < -1 and "boom" in str(error)


def test_statuses_and_abi_match_the_header() -> None:
    shim = native().shim
    for status in Status:
        assert getattr(shim, f"LLAMAPY_{'OK' if status is Status.OK else 'ERR_' + status.name}"
                       ) == status
    assert shim.llamapy_shim_abi() == shim.LLAMAPY_SHIM_ABI == SHIM_ABI


def test_a_missing_or_foreign_shim_is_a_typed_error(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    nat = native()
    with pytest.raises(LibraryNotFoundError, match="shim is missing"):
        load_shim(nat.ffi, tmp_path / "libllama.so")
    monkeypatch.setattr("llamapy._native._loader.SHIM_ABI", SHIM_ABI + 1)
    with pytest.raises(LibraryNotFoundError, match="ABI"):
        load_shim(nat.ffi, nat.lib_path)


def test_the_build_is_keyed_on_the_shim_sources(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The built shim comes from this checkout's sources, and an edit makes ``build_lib.py``
    rebuild it (the shim only: the library's own key does not change)."""
    spec = importlib.util.spec_from_file_location("build_lib", ROOT / "build_lib.py")
    assert spec is not None and spec.loader is not None
    build_lib = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_lib)
    build = native().lib_path.parent.parent
    record = json.loads((build / "build.json").read_text())
    assert record["shim"] == build_lib.shim_key(build, record["key"])
    edited = tmp_path / "llamapy_shim.cpp"
    edited.write_text(build_lib.SHIM_SOURCE.read_text() + "\n// edited\n")
    monkeypatch.setattr(build_lib, "SHIM_SOURCE", edited)
    assert build_lib.shim_key(build, record["key"]) != record["shim"]
    assert not build_lib.is_complete(build, record, build_lib.shim_key(build, record["key"]))


#: Runs in a child whose address space is capped just above what it uses, so that what a
#: request could ask for (a 2**30-token window, 8M biases, a long text) fails to allocate.
_OUT_OF_MEMORY = r"""
from llamapy._native import Model, SamplerChain, native
from llamapy._native._shim import WHAT_SIZE, check_error
from llamapy.models import default_model_path

model = Model(default_model_path())
ffi, shim = native().ffi, native().shim
chains = [SamplerChain(model) for _ in range(3)]
biases = ffi.new("llama_logit_bias[]", 8 << 20)
text = ("hello world " * (1 << 19)).encode()
tokens, n = ffi.new("llama_token[]", 16), ffi.new("int32_t *")
out = ffi.new("struct llama_sampler **")
what = ffi.new("char[]", WHAT_SIZE)
cases = {
    "penalties": lambda: chains[0].add_penalties(1 << 30, 1.1, 0.0, 0.0),
    "dry": lambda: chains[1].add_dry(0.8, 1.75, 2, 1 << 30),
    "logit_bias": lambda: check_error(shim.llamapy_sampler_init_logit_bias(
        model.n_vocab, 8 << 20, biases, out, what, WHAT_SIZE), what,
        "llama_sampler_init_logit_bias"),
    "tokenize": lambda: check_error(shim.llamapy_tokenize(
        model.vocab, text, len(text), tokens, 16, False, False, n, what, WHAT_SIZE), what,
        "llama_tokenize"),
    "small window": lambda: chains[2].add_penalties(64, 1.1, 0.0, 0.0),
}
cap = 32 << 20
"""


@LINUX_ONLY
def test_constructors_and_tokenize_out_of_memory_are_typed_errors() -> None:
    results = run_capped(_OUT_OF_MEMORY)
    assert results == {"penalties": "NativeMemoryError", "dry": "NativeMemoryError",
                       "logit_bias": "NativeMemoryError", "tokenize": "NativeMemoryError",
                       "small window": "ok"}


def test_the_heartbeat_counts_while_a_decode_computes_and_aborts_it(model: Model,
                                                                    ctx: Context) -> None:
    """libllama's abort callback is the shim's heartbeat: ggml calls it between the nodes of a
    decode's graph (the stall watch reads the count), and its flag still aborts a decode."""
    ctx.clear()
    before = ctx.progress
    batch = Batch(64)
    batch.add(0, 0, model.tokenize("Count the beats."))
    ctx.decode(batch)
    assert ctx.progress > before
    ctx.clear()
    ctx.set_abort(True)
    try:
        with pytest.raises(DecodeAbortedError):
            ctx.decode(batch)
    finally:
        ctx.set_abort(False)
    ctx.clear()
    ctx.decode(batch)  # cleared: decodes again
