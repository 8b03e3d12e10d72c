"""Context checkpoints on real hybrid models (the tiny generated LFM2 and Qwen3.5, random
weights): a prompt that diverges inside the cached one resumes from the checkpoint before the
divergence, a chat's next turn resumes at the previous generation prompt, checkpoints come back
from the RAM and disk caches (after a restart too), and greedy outputs equal those computed
with no reuse. Random weights prove the state is saved and restored exactly (equal outputs);
they say nothing of answer quality."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from llamapy.serve import create_app
from llamapy.server import Server
from llamapy.testing import tiny_hybrid_path

GREEDY = {"temp": 0.0}
ARCHES = ("lfm2", "qwen35")


def text(seed: int, n: int) -> list[int]:
    """``n`` byte tokens of a deterministic text (the tiny models' vocabulary is bytes)."""
    return [ord("a") + (i * seed + i // 7) % 26 for i in range(n)]


def open_server(arch: str, **options: object) -> Server:
    options = {"n_ctx": 8192, "n_parallel": 1, "n_threads": 1, "checkpoint_min_step": 256,
               **options}
    return Server(tiny_hybrid_path(arch=arch), **options).wait_ready(60)


@pytest.mark.parametrize("arch", ARCHES)
def test_a_divergence_inside_the_prompt_restores_the_checkpoint_before_it(arch: str) -> None:
    base = text(7, 1200)
    changed = base[:900] + text(3, 40)
    with open_server(arch) as server:
        server.complete_tokens(base, max_tokens=2, **GREEDY)
        reused = server.complete_tokens(changed, max_tokens=6, **GREEDY)
        fresh = server.complete_tokens(changed, max_tokens=6, cache_prompt=False, **GREEDY)
    assert reused.timings.reuse_source == "own" and reused.timings.reused_tokens == 768
    assert reused.timings.checkpoint_tokens == 768 and reused.timings.checkpoint_behind == 132
    assert reused.token_ids == fresh.token_ids


@pytest.mark.parametrize("arch", ARCHES)
def test_chat_turns_resume_at_the_previous_prompt_and_match_no_reuse(arch: str) -> None:
    messages = [{"role": "system", "content": "rules " * 300},
                {"role": "user", "content": "first question"}]
    with open_server(arch) as warm, open_server(arch) as cold, \
            TestClient(create_app(warm, alias="tiny"), base_url="http://localhost") as client, \
            TestClient(create_app(cold, alias="tiny"), base_url="http://localhost") as reference:
        previous = 0
        for turn in range(3):
            body = {"model": "tiny", "messages": messages, "max_tokens": 5, "temperature": 0}
            answer = client.post("/v1/chat/completions", json=body).json()
            expected = reference.post("/v1/chat/completions",
                                      json={**body, "cache_prompt": False}).json()
            reply = answer["choices"][0]["message"]["content"]
            assert reply == expected["choices"][0]["message"]["content"]
            cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            # all of the previous prompt but its generation header, at least
            assert cached >= previous - 3, (turn, cached, previous)
            if turn:  # the answer diverged from what was generated: back to the prompt's end
                assert answer["timings"]["cache_checkpoint_n"] == cached
            previous = answer["usage"]["prompt_tokens"]
            messages += [{"role": "assistant", "content": f"an answer {turn}"},
                         {"role": "user", "content": f"question {turn + 2}"}]
        slot = client.get("/slots").json()[0]
        assert previous in slot["checkpoints"] and slot["checkpoint_bytes"] > 0


def test_checkpoints_survive_the_ram_cache_and_a_restart(tmp_path: Path) -> None:
    a, b = text(7, 1100), text(11, 1100)
    options = {"prompt_cache_ram_mb": 64, "prompt_cache_dir": str(tmp_path)}
    with open_server("lfm2", **options) as server:
        server.complete_tokens(a, max_tokens=2, **GREEDY)
        server.complete_tokens(b, max_tokens=2, **GREEDY)  # a's prefix goes to RAM
        from_ram = server.complete_tokens(a[:600] + text(5, 30), max_tokens=4, **GREEDY)
    assert from_ram.timings.reuse_source == "ram" and from_ram.timings.reused_tokens == 512
    with open_server("lfm2", **options) as server:
        from_disk = server.complete_tokens(b[:800] + text(5, 30), max_tokens=4, **GREEDY)
        fresh = server.complete_tokens(b[:800] + text(5, 30), max_tokens=4, cache_prompt=False,
                                **GREEDY)
    assert from_disk.timings.reuse_source == "disk"
    assert from_disk.timings.reused_tokens == 768 and from_disk.timings.checkpoint_tokens == 768
    assert from_disk.token_ids == fresh.token_ids


@pytest.mark.second_model
def test_a_window_cache_of_only_the_window_resumes_from_checkpoints(
        second_model_path: Path) -> None:
    """Gemma 3's sliding-window layers with ``swa_full`` off keep only their window: such a
    cache cannot be cut back either, so it resumes from checkpoints (its window alone)."""
    prompt = "The tide comes in, the tide goes out. " * 90
    with Server(second_model_path, n_ctx=4096, n_parallel=1, n_threads=1, swa_full=False,
                checkpoint_min_step=256) as server:
        server.wait_ready(60)
        tokens = server.fetch_model().tokenize(prompt, True, True)
        changed = list(tokens[:900]) + list(tokens[:30])
        server.complete_tokens(tokens, max_tokens=2, **GREEDY)
        reused = server.complete_tokens(changed, max_tokens=6, **GREEDY)
        fresh = server.complete_tokens(changed, max_tokens=6, cache_prompt=False, **GREEDY)
    assert reused.timings.reused_tokens == 768 and reused.timings.checkpoint_tokens == 768
    assert reused.token_ids == fresh.token_ids
