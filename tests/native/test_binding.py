"""The cffi binding on the real model: layout, vocab, decode, memory ops, state, samplers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llamapy._native import (
    Batch,
    Context,
    Model,
    SamplerChain,
    apply_chat_template,
    check_layout,
    native,
)
from llamapy._native._loader import layout_file
from llamapy.errors import (
    ClosedError,
    GrammarError,
    KVCacheFullError,
    LibraryNotFoundError,
    ModelLoadError,
    UnknownOptionError,
)


def _greedy(model: Model, ctx: Context, prompt: list[int], n: int, seq: int = 0) -> list[int]:
    batch = Batch(max(len(prompt), 8))
    row = batch.add(seq, 0, prompt)
    ctx.decode(batch)
    out: list[int] = []
    with SamplerChain(model).add_greedy() as chain:
        pos = len(prompt)
        for _ in range(n):
            tok = chain.sample(ctx, row)
            out.append(tok)
            batch.clear()
            row = batch.add(seq, pos, [tok])
            pos += 1
            ctx.decode(batch)
    return out


@pytest.fixture()
def ctx(model: Model):
    with Context(model, n_ctx=1024, n_batch=256, n_seq_max=4, kv_unified=True, n_threads=2) as c:
        yield c


def test_struct_layouts_match_the_c_compiler() -> None:
    layout = json.loads(layout_file(native().lib_path).read_text())
    for struct in ("llama_batch", "llama_model_params", "llama_context_params",
                   "llama_sampler_chain_params", "llama_token_data", "llama_token_data_array",
                   "llama_chat_message", "llama_logit_bias"):
        assert struct in layout
    assert check_layout(native().ffi, layout) == []


def test_layout_check_reports_a_mismatch() -> None:
    layout = json.loads(layout_file(native().lib_path).read_text())
    layout["llama_batch"]["__sizeof__"] += 8
    layout["llama_context_params"]["n_batch"] += 4
    problems = check_layout(native().ffi, layout)
    assert any("llama_batch" in p and "sizeof" in p for p in problems)
    assert any("llama_context_params.n_batch" in p for p in problems)


def test_import_is_lazy_and_missing_library_is_a_typed_error(tmp_path: Path) -> None:
    code = (
        "import llamapy._native as n, llamapy._native._loader as l\n"
        "assert l._native is None\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert 'libllama' not in maps\n"
        "from llamapy.errors import LibraryNotFoundError\n"
        "try:\n    n.native()\nexcept LibraryNotFoundError as e:\n    print('typed:', e)\n"
    )
    env = dict(os.environ, LLAMAPY_LIB=str(tmp_path / "nowhere"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "typed:" in out.stdout and "build_lib.py" in out.stdout
    assert issubclass(LibraryNotFoundError, Exception)


def test_metadata(model: Model) -> None:
    meta = model.metadata()
    assert meta["general.architecture"] == "llama"
    assert model.n_vocab == 49152
    assert model.n_params > 100_000_000
    assert model.n_ctx_train >= 2048
    assert model.n_embd == 576
    assert model.size > 50_000_000
    assert "llama" in model.description


@pytest.mark.parametrize("text", ["Hello, world!", "naïve café — 日本語 🙂", "  spaces\n\ttabs"])
def test_tokenize_detokenize_round_trip(model: Model, text: str) -> None:
    tokens = model.tokenize(text, add_special=False)
    assert tokens
    assert model.detokenize(tokens) == text
    assert b"".join(model.token_to_piece(t) for t in tokens).decode() == text


def test_special_tokens_parse_and_render(model: Model) -> None:
    text = "<|im_start|>user\nhi<|im_end|>"
    parsed = model.tokenize(text, add_special=False, parse_special=True)
    literal = model.tokenize(text, add_special=False, parse_special=False)
    start = model.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert len(start) == 1 and parsed[0] == start[0]
    assert len(literal) > len(parsed)
    assert model.detokenize(parsed, unparse_special=True) == text
    assert model.is_eog(model.eos)


def test_chat_template_has_chatml_markers(model: Model) -> None:
    assert "<|im_start|>" in (model.chat_template() or "")
    text = apply_chat_template(model, [{"role": "user", "content": "Hi"}])
    assert "<|im_start|>user\nHi<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_option_defaults_reach_the_native_objects(model: Model, model_path: Path) -> None:
    assert model.options.n_gpu_layers == 99
    with Context(model, n_threads=2) as c:  # the tree's defaults: 8192 / 2048 / 4 / unified
        assert (c.n_ctx, c.n_batch, c.n_seq_max) == (8192, 2048, 4)
        assert c.options.kv_unified and c.n_ctx_seq == 8192
    with Model(model_path, vocab_only=True) as vocab:  # Model takes it; a Server never does
        assert vocab.options.vocab_only and vocab.n_vocab == model.n_vocab
        assert vocab.tokenize("Hello") == model.tokenize("Hello")


def test_greedy_generation_is_deterministic(model: Model) -> None:
    prompt = model.tokenize("The capital of France is", add_special=True)
    runs = []
    for _ in range(2):
        with Context(model, n_ctx=256, n_batch=64, n_threads=2) as c:
            runs.append(_greedy(model, c, prompt, 12))
    assert runs[0] == runs[1]
    assert "Paris" in model.detokenize(runs[0])


def test_batch_of_four_matches_single_runs(model: Model, ctx: Context) -> None:
    prompts = [model.tokenize(p) for p in ("One, two,", "The sky is", "def main():", "Roses")]
    singles = []
    for p in prompts:
        ctx.clear()
        singles.append(_greedy(model, ctx, p, 1)[0])
    ctx.clear()
    batch = Batch(256)
    rows = [batch.add(i, 0, p) for i, p in enumerate(prompts)]
    ctx.decode(batch)
    firsts = [int(np.argmax(ctx.logits(r))) for r in rows]
    assert firsts == singles


def test_seq_cp_copy_decodes_like_the_original(model: Model, ctx: Context) -> None:
    prompt = model.tokenize("Once upon a time, there was a")
    batch = Batch(64)
    batch.add(0, 0, prompt[:-1], logits_last=False)
    ctx.decode(batch)
    ctx.seq_cp(0, 1, 0, -1)
    assert ctx.seq_pos_max(1) == len(prompt) - 2
    batch.clear()
    r0 = batch.add(0, len(prompt) - 1, prompt[-1:])
    r1 = batch.add(1, len(prompt) - 1, prompt[-1:])
    ctx.decode(batch)
    np.testing.assert_allclose(ctx.logits(r0), ctx.logits(r1), rtol=1e-4, atol=1e-4)


def test_state_roundtrip_reproduces_next_token_logits(model: Model, ctx: Context) -> None:
    prompt = model.tokenize("The quick brown fox jumps over the")
    batch = Batch(64)
    batch.add(2, 0, prompt[:-1], logits_last=False)
    ctx.decode(batch)
    state = ctx.state_seq_get(2)
    assert ctx.state_seq_size(2) == len(state) > 0
    assert ctx.state_seq_size(2) > ctx.state_seq_size(3) == len(ctx.state_seq_get(3))  # empty
    batch.clear()
    batch.add(2, len(prompt) - 1, prompt[-1:])
    ctx.decode(batch)
    expected = ctx.logits(0).copy()
    ctx.clear()
    assert ctx.seq_pos_max(2) == -1
    assert ctx.state_seq_set(2, state)
    assert ctx.seq_pos_max(2) == len(prompt) - 2
    batch.clear()
    batch.add(2, len(prompt) - 1, prompt[-1:])
    ctx.decode(batch)
    np.testing.assert_allclose(ctx.logits(0), expected, rtol=1e-4, atol=1e-4)
    assert not ctx.state_seq_set(3, b"garbage")


def test_grammar_forces_yes_or_no(model: Model, ctx: Context) -> None:
    prompt = model.tokenize(apply_chat_template(model, [{"role": "user", "content": "Hi!"}]),
                            parse_special=True)
    batch = Batch(128)
    row = batch.add(0, 0, prompt)
    ctx.decode(batch)
    chain = SamplerChain(model).add_grammar('root ::= "yes" | "no"').add_dist(seed=7)
    out, pos = [], len(prompt)
    for _ in range(4):
        tok = chain.sample(ctx, row)
        if model.is_eog(tok):
            break
        out.append(tok)
        batch.clear()
        row = batch.add(0, pos, [tok])
        pos += 1
        ctx.decode(batch)
    chain.close()
    assert model.detokenize(out) in ("yes", "no")


@pytest.mark.parametrize("grammar", ["root ::= foo", "root ::= [a-", "root ::= (\"x\""])
def test_invalid_grammar_raises_grammar_error(model: Model, grammar: str) -> None:
    with pytest.raises(GrammarError, match=r"parsing grammar|parse grammar"):
        SamplerChain(model).add_grammar(grammar)


def test_sampler_chain_clone_and_seeded_dist(model: Model, ctx: Context) -> None:
    prompt = model.tokenize("Write a word:")
    batch = Batch(64)
    row = batch.add(0, 0, prompt)
    ctx.decode(batch)
    a = SamplerChain(model).add_top_k(40).add_temp(1.0).add_dist(seed=123)
    b = a.clone()
    assert a.names == b.names and len(b) == 3
    assert a.sample(ctx, row) == b.sample(ctx, row)
    a.close()
    b.close()
    a.close()


def test_missing_and_corrupt_model_files_raise_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        Model(tmp_path / "missing.gguf")
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))
    with pytest.raises(ModelLoadError, match="failed to load"):
        Model(bad)
    bad.write_bytes(os.urandom(4096))
    with pytest.raises(ModelLoadError):
        Model(bad)
    with pytest.raises(UnknownOptionError, match="valid keys"):
        Model(bad, n_gpu_layer=1)


def test_kv_full_is_a_typed_error(model: Model) -> None:
    with Context(model, n_ctx=256, n_batch=128, n_ubatch=128, n_threads=2) as c:
        batch = Batch(128)
        for start in (0, 100):
            batch.clear()
            batch.add(0, start, [1] * 100)
            c.decode(batch)
        batch.clear()
        batch.add(0, 200, [1] * 100)
        with pytest.raises(KVCacheFullError) as info:
            c.decode(batch)
        assert info.value.code == 1
        assert c.seq_pos_max(0) == 199  # nothing of the failed batch was kept


def test_use_after_close_raises(model_path: Path) -> None:
    m = Model(model_path)
    c = Context(m, n_ctx=128, n_batch=32)
    m.close()  # deferred: the context still holds the model
    assert m.closed
    c.decode(Batch(4))  # empty batch: no-op, context still alive
    c.close()
    c.close()
    with pytest.raises(ClosedError):
        c.seq_pos_max(0)
    with pytest.raises(ClosedError):
        m.tokenize("x")
    m.close()


def test_llama_logs_go_to_logging(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" * 100)
    with caplog.at_level("DEBUG", logger="llamapy.llama_cpp"), pytest.raises(ModelLoadError):
        Model(bad)
    assert any(r.name == "llamapy.llama_cpp" for r in caplog.records)


def test_lora_adapter_changes_logits_and_detaches(model: Model, tmp_path: Path) -> None:
    from llamapy._native import LoraAdapter
    from llamapy.testing import write_random_lora

    path = write_random_lora(model.path, tmp_path / "lora.gguf", rank=4, std=0.2, seed=1)
    prompt = model.tokenize("The weather today is")

    def last_logits(ctx: Context) -> np.ndarray:
        ctx.clear()
        batch = Batch(32)
        row = batch.add(0, 0, prompt)
        ctx.decode(batch)
        return ctx.logits(row).copy()

    with Context(model, n_ctx=256, n_batch=32, n_threads=2) as ctx, \
            LoraAdapter(model, path) as adapter:
        base = last_logits(ctx)
        ctx.set_adapters([(adapter, 1.0)])
        tuned = last_logits(ctx)
        assert not np.allclose(base, tuned, atol=1e-3)
        ctx.set_adapters([])
        np.testing.assert_allclose(last_logits(ctx), base, rtol=1e-4, atol=1e-4)
    with pytest.raises(ModelLoadError):
        LoraAdapter(model, tmp_path / "missing.gguf")
