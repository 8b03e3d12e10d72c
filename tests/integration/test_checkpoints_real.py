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
from llamapy.session import DecodeConfig, PrefixInput, PrefixSegment, SuffixInput
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


@pytest.mark.parametrize("arch", ARCHES)
def test_a_busy_slot_donates_its_prefix_to_another(arch: str) -> None:
    """A conversation on a second slot starts from a copy of the first slot's state, rewound
    to its checkpoint inside the shared part; the donor's own generation goes on unchanged."""
    system = text(7, 700)
    with open_server(arch, n_parallel=2) as server:
        never_end = {t: float("-inf") for t in server.fetch_model().eog_tokens()}
        long_run = {"max_tokens": 40, "logit_bias": never_end, **GREEDY}
        server.complete_tokens(system + text(3, 20), max_tokens=1, **GREEDY)
        with server.stream_tokens(system + text(3, 21), **long_run) as busy:
            next(iter(busy))  # the first slot is now generating
            donated = server.complete_tokens(system + text(5, 30), max_tokens=6, **GREEDY)
            donor_text = "".join(busy)
        fresh = server.complete_tokens(system + text(5, 30), max_tokens=6, cache_prompt=False,
                                       **GREEDY)
        alone = server.complete_tokens(system + text(3, 21), cache_prompt=False, **long_run)
    assert donated.timings.reuse_source == "donor" and donated.timings.reused_tokens == 512
    assert donated.timings.checkpoint_tokens == 512
    assert donated.token_ids == fresh.token_ids
    assert alone.text.endswith(donor_text)


def test_a_session_resumes_a_changed_segment_from_the_end_of_the_one_before() -> None:
    def prefix(repo: str) -> PrefixInput:
        return PrefixInput(segments=(PrefixSegment(kind="instructions", text="rules " * 200),
                                     PrefixSegment(kind="repo_map", text=repo)))

    def answer(server: Server, repo: str) -> tuple[int, str]:
        with server.open_session() as session:
            status = session.ensure_prefix(prefix("src/a.py " * 50))
            status = session.ensure_prefix(prefix(repo)) if repo else status
            session.prefill_suffix(SuffixInput(text="\nUser: where?\nAssistant:"))
            text = "".join(c.text for c in session.decode(DecodeConfig(max_tokens=6,
                                                                        temperature=0.0)))
            return status.timings.checkpoint_tokens, text

    with open_server("qwen35", checkpoint_min_step=0) as server:
        restored, resumed = answer(server, "src/b.py " + "src/a.py " * 50)
    with open_server("qwen35", checkpoint_min_step=0, ctx_checkpoints=0) as server:
        _, fresh = answer(server, "src/b.py " + "src/a.py " * 50)
    assert restored > 1000 and resumed == fresh


def test_many_turns_keep_checkpoints_within_their_bounds() -> None:
    """Three conversations take turns on two slots for 30 turns, each turn sometimes
    rewriting an earlier part of its history: every slot stays within the count and byte
    bounds after every turn (the newest checkpoint always kept), and reuse still matches
    no reuse at the end."""
    bound = {"ctx_checkpoints": 5, "ctx_checkpoints_mb": 0.005, "checkpoint_min_step": 64}
    histories = [text(seed, 300) for seed in (3, 5, 7)]
    with open_server("lfm2", n_parallel=2, prompt_cache_ram_mb=1, **bound) as server:
        for turn in range(30):
            history = histories[turn % 3]
            if turn % 4 == 3:  # an earlier tool result re-rendered
                history[len(history) // 2:len(history) // 2 + 8] = text(turn, 8)
            answer = server.complete_tokens(history, max_tokens=4, **GREEDY)
            history += [*answer.token_ids, *text(turn + 11, 60)]
            for slot in server.slots():
                held = slot["checkpoints"]
                assert len(held) <= 5 and (held or not slot["cached_tokens"]), slot
                assert slot["checkpoint_bytes"] <= 0.005 * 1024 * 1024, slot
        reused = server.complete_tokens(histories[0], max_tokens=6, **GREEDY)
        fresh = server.complete_tokens(histories[0], max_tokens=6, cache_prompt=False,
                                       **GREEDY)
    assert reused.timings.reused_tokens > 0 and reused.token_ids == fresh.token_ids


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
