"""What makes ``python -m llamapy.serve`` start fast: the weights prefetched while Python
imports, a quick GIL hand-off for the load's log callbacks, nothing heavy imported early."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from llamapy._native import Batch, Context, Model, ModelOptions, SamplerChain, _logging
from llamapy._native.prefetch import prefetch, take
from llamapy.errors import ModelLoadError
from llamapy.server import Server


def test_a_prefetched_model_is_taken_once_and_only_for_its_options(model_path: Path) -> None:
    options = ModelOptions()
    prefetch(model_path, options)
    assert take(model_path, ModelOptions(vocab_only=True)) is None
    model = take(model_path, options)
    try:
        assert isinstance(model, Model) and model.n_vocab > 0
        assert take(model_path, options) is None
    finally:
        assert model is not None
        model.close()


def test_a_failed_prefetch_raises_its_error_when_taken(tmp_path: Path) -> None:
    missing = tmp_path / "missing.gguf"
    prefetch(missing, ModelOptions())
    with pytest.raises(ModelLoadError, match="not found"):
        take(missing, ModelOptions())
    assert take(missing, ModelOptions()) is None


def test_a_server_takes_the_prefetched_weights(model_path: Path, tmp_path: Path) -> None:
    link = tmp_path / "linked.gguf"  # the prefetch is keyed by the file, loaded by the name
    link.symlink_to(model_path)
    prefetch(link, ModelOptions())
    with Server(link, n_ctx=512, n_parallel=1) as server:
        server.wait_ready(120)
        assert take(model_path, ModelOptions()) is None  # the server took it
        assert server.model.path == link  # as a model the server loaded itself would be
        assert server.complete("Hi", max_tokens=2, temp=0.0).usage.completion_tokens


def test_loud_calls_hand_the_gil_over_quickly_and_restore_the_interval() -> None:
    before = sys.getswitchinterval()
    inside: list[float] = []
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with _logging.loud_call():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    assert entered.wait(10)
    with _logging.loud_call():
        inside.append(sys.getswitchinterval())
    inside.append(sys.getswitchinterval())  # the other block is still open
    release.set()
    thread.join(10)
    assert inside == pytest.approx([_logging.LOUD_SWITCH_INTERVAL] * 2)
    assert sys.getswitchinterval() == before


def test_a_multi_token_run_fills_the_batch_rows() -> None:
    batch = Batch(8)
    assert batch.add(0, 0, [7]) == 0
    assert batch.add(3, 10, [1, 2, 3, 4], logits_last=True, n_outputs=2) == 4
    assert batch.add(5, 0, [9, 9], logits_last=False) == 6
    s = batch.struct
    assert s.n_tokens == 7
    assert [s.token[i] for i in range(7)] == [7, 1, 2, 3, 4, 9, 9]
    assert [s.pos[i] for i in range(7)] == [0, 10, 11, 12, 13, 0, 1]
    assert [s.seq_id[i][0] for i in range(7)] == [0, 3, 3, 3, 3, 5, 5]
    assert [s.n_seq_id[i] for i in range(7)] == [1] * 7
    assert [s.logits[i] for i in range(7)] == [1, 0, 0, 1, 1, 0, 0]


def _imported_after(statement: str) -> set[str]:
    heavy = ("numpy", "jinja2", "pydantic", "starlette", "llamapy.engine", "llamapy.server")
    code = (f"import sys\n{statement}\n"
            f"print(' '.join(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=120)
    return set(out.stdout.split())


def test_the_command_line_imports_nothing_heavy_before_the_weights_load() -> None:
    assert _imported_after("import llamapy.serve.__main__") == set()


def test_the_app_imports_neither_numpy_nor_jinja2() -> None:
    imported = _imported_after("import llamapy.serve.app")
    assert "starlette" in imported  # the probe sees what the app does import
    assert not imported & {"numpy", "jinja2"}


def _greedy_after(model: Model, warm: bool, prompt: list[int]) -> list[int]:
    with Context(model, n_ctx=256, n_batch=64) as ctx, SamplerChain(model).add_greedy() as chain:
        if warm:
            ctx.warmup()
            assert ctx.seq_pos_max(0) == -1  # the warm-up left nothing behind
        batch = Batch(64)
        row = batch.add(0, 0, prompt)
        out: list[int] = []
        for pos in range(len(prompt), len(prompt) + 8):
            ctx.decode(batch)
            out.append(chain.sample(ctx, row))
            batch.clear()
            row = batch.add(0, pos, [out[-1]])
        return out


def test_the_warmup_decode_leaves_a_clean_context(model: Model) -> None:
    prompt = model.tokenize("The capital of France is")
    assert _greedy_after(model, True, prompt) == _greedy_after(model, False, prompt)


def test_warmup_is_on_by_default_and_off_with_the_llama_server_flag() -> None:
    from llamapy.serve.cli import build_parser
    from llamapy.serve.flags.start import serve_start_options

    assert serve_start_options(build_parser().parse_args([])).get("warmup", True) is True
    off = serve_start_options(build_parser().parse_args(["--no-warmup"]))
    assert off["warmup"] is False
