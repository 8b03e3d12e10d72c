"""The tiny hybrid models of ``llamapy.testing.tiny_hybrid_path`` on the real libllama: each
loads as a model with recurrent memory, its byte-level vocabulary gives any text back, a
prompt decodes to finite logits (the same whole or in pieces, fresh or restored from a saved
state), its bytes are the pinned ones, and the server serves it.

Their weights are arbitrary: nothing here says anything of quality.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from llamapy._native import Model
from llamapy._native._loader import native
from llamapy._native.context import Batch, Context
from llamapy._paths import sha256_file
from llamapy.errors import InvalidOptionError, ModelNotFoundError
from llamapy.models import main
from llamapy.serve import create_app
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.compat import check_compat
from llamapy.serve.flags.start import serve_start_options
from llamapy.server import Server
from llamapy.testing import TINY_HYBRID_SHA256, tiny_hybrid_path
from llamapy.testing.tiny_hybrid import write_tiny_hybrid

ARCHES = list(TINY_HYBRID_SHA256)
TEXTS = ["Hello, world!", "ünïcödé, 日本語 and 🎉", "\ttabs\n\nnew lines  and  spaces ",
         "\x00\x01 control \x7f bytes", "the theory is interesting"]
#: ``llama_state_seq_get_size_ext``'s flag for the partial state (recurrent or SWA memory).
PARTIAL_ONLY = 1


@pytest.fixture(scope="module", params=ARCHES)
def model(request: pytest.FixtureRequest) -> Iterator[Model]:
    with Model(tiny_hybrid_path(arch=request.param)) as m:
        yield m


def prompt_ids(n: int) -> list[int]:
    """``n`` byte tokens, a fixed arbitrary sequence."""
    return [(7 * i + 3) % 256 for i in range(n)]


def decode(ctx: Context, seq_id: int, start: int, token_ids: list[int]) -> np.ndarray:
    """Decode a run of ``seq_id`` and return a copy of its last logits."""
    batch = Batch(len(token_ids))
    batch.add(seq_id, start, token_ids)
    ctx.decode(batch)
    return np.array(ctx.logits(-1))


def test_each_loads_with_recurrent_memory_and_a_chat_template(model: Model) -> None:
    arch = model.meta("general.architecture")
    assert model.is_recurrent and model.meta("general.name") == f"llamapy-tiny-{arch}"
    assert model.n_embd == 64 and model.n_ctx_train >= 4096
    template = model.chat_template()
    assert template is not None and "<|im_start|>" in template
    assert model.token_text(model.eos) == "<|im_end|>" and model.is_eog(model.eos)
    assert not model.add_bos


def test_any_text_round_trips_through_the_vocabulary(model: Model) -> None:
    for text in TEXTS:
        token_ids = model.tokenize(text, add_special=False)
        assert model.detokenize(token_ids) == text
        assert len(token_ids) <= len(text.encode())  # a byte a token, less where merges join
    turn = "<|im_start|>user\nhi<|im_end|>\n"
    chat = model.tokenize(turn, parse_special=True)
    assert model.detokenize(chat, unparse_special=True) == turn
    assert chat[0] == model.tokenize("<|im_start|>", parse_special=True)[0]
    assert chat[-2] == model.eos


def test_a_prompt_decodes_to_the_same_finite_logits_whole_or_in_pieces(model: Model) -> None:
    token_ids = prompt_ids(300)
    with Context(model, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=1) as ctx:
        whole = decode(ctx, 0, 0, token_ids)
        ctx.clear()
        decode(ctx, 0, 0, token_ids[:170])
        pieces = decode(ctx, 0, 170, token_ids[170:])
    assert whole.shape == (model.n_vocab,) and np.isfinite(whole).all() and whole.std() > 0
    np.testing.assert_allclose(pieces, whole, rtol=1e-4, atol=1e-4)


def test_a_saved_state_restores_the_next_logits(model: Model) -> None:
    token_ids = prompt_ids(200)
    with Context(model, n_ctx=1024, n_batch=256, n_seq_max=2, n_threads=1) as ctx:
        decode(ctx, 0, 0, token_ids)
        state = ctx.state_seq_get(0)
        expected = decode(ctx, 0, 200, [42])
        assert ctx.state_seq_set(1, state)
        assert np.array_equal(decode(ctx, 1, 200, [42]), expected)


def test_the_partial_state_leaves_the_attention_cache_out(model: Model) -> None:
    """After 1000 tokens the whole state carries their KV cells; the partial one only the
    recurrent blocks' fixed-size state."""
    lib = native().lib
    with Context(model, n_ctx=2048, n_batch=1024, n_threads=1) as ctx:
        decode(ctx, 0, 0, prompt_ids(1000))
        whole = lib.llama_state_seq_get_size(ctx.ptr, 0)
        partial = lib.llama_state_seq_get_size_ext(ctx.ptr, 0, PARTIAL_ONLY)
    assert 0 < partial * 10 < whole


@pytest.mark.parametrize("arch", ARCHES)
def test_the_bytes_are_the_pinned_ones(arch: str, tmp_path_factory: pytest.TempPathFactory
                                       ) -> None:
    tmp = tmp_path_factory.mktemp(arch)
    first, second = (write_tiny_hybrid(tmp / f"{n}.gguf", arch) for n in ("a", "b"))
    assert first.read_bytes() == second.read_bytes()
    assert sha256_file(first) == sha256_file(tiny_hybrid_path(arch=arch)) \
        == TINY_HYBRID_SHA256[arch]


def test_the_model_fetcher_writes_them_into_an_empty_cache(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LLAMAPY_CACHE", str(tmp_path_factory.mktemp("cache")))
    with pytest.raises(ModelNotFoundError):
        tiny_hybrid_path(fetch=False)
    assert main(["fetch", "--hybrid"]) == 0
    written = capsys.readouterr().out.split()
    assert written == [str(tiny_hybrid_path(fetch=False, arch=arch)) for arch in ARCHES]
    assert [sha256_file(Path(p)) for p in written] == [TINY_HYBRID_SHA256[a] for a in ARCHES]


def test_an_unknown_architecture_is_refused(tmp_path_factory: pytest.TempPathFactory) -> None:
    with pytest.raises(InvalidOptionError):
        write_tiny_hybrid(tmp_path_factory.mktemp("x") / "x.gguf", "llama")
    with pytest.raises(ModelNotFoundError):
        tiny_hybrid_path(arch="llama")


def serve(argv: list[str]) -> Server:
    """The server ``python -m llamapy.serve`` starts for ``argv``."""
    args = build_parser().parse_args(argv)
    check_compat(args)
    return Server(args.model[0], **serve_start_options(args)).wait_ready(60)


@pytest.mark.parametrize("arch", ARCHES)
def test_the_server_chats_greedily_and_the_same_twice(arch: str) -> None:
    server = serve(["--model", str(tiny_hybrid_path(arch=arch)), "-c", "8192", "-np", "1",
                    "-t", "1"])
    messages = [{"role": "system", "content": "x " * 1500},  # some thousands of tokens
                {"role": "user", "content": "Say something, ünïcode welcome."}]
    body = {"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0}
    with TestClient(create_app(server, alias="tiny", own_server=True),
                    base_url="http://localhost") as client:
        answers = [client.post("/v1/chat/completions", json=body) for _ in range(2)]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        usage = answer.json()["usage"]
        assert usage["prompt_tokens"] > 3000 and 0 < usage["completion_tokens"] <= 8
    first, again = (a.json()["choices"][0]["message"]["content"] for a in answers)
    assert first == again
