"""Server on the real model: prefix reuse within a cache scope and never across, and the RAM
cache bringing back a prefix whose slot another prompt took."""

from __future__ import annotations

from pathlib import Path

from server_helpers import chat, wait_idle

from llamapy.server import Server

GREEDY = {"temp": 0.0}


def test_cache_scope_isolation_and_prefix_reuse(server: Server) -> None:
    system = "You are a meticulous assistant. " * 60
    first = server.complete(chat(server, system + "Question one?"), max_tokens=4,
                            cache_scope="a", **GREEDY)
    assert first.timings.reused_tokens == 0
    other = server.complete(chat(server, system + "Question two?"), max_tokens=4,
                            cache_scope="b", **GREEDY)
    assert other.timings.reused_tokens == 0
    same = server.complete(chat(server, system + "Question three?"), max_tokens=4,
                           cache_scope="a", **GREEDY)
    assert same.timings.reused_tokens > 300
    assert same.usage.cached_tokens == same.timings.reused_tokens
    wait_idle(server)


def test_ram_cache_restores_an_evicted_prefix(model_path: Path) -> None:
    with Server(model_path, n_ctx=2048, n_parallel=1, n_batch=512,
                prompt_cache_ram_mb=64) as server:
        server.wait_ready(60)
        a = chat(server, "Facts about the moon. " * 40)
        b = chat(server, "Facts about the sun. " * 40)
        server.complete(a, max_tokens=2, **GREEDY)
        server.complete(b, max_tokens=2, **GREEDY)  # evicts a's prefix into the RAM cache
        again = server.complete(a, max_tokens=2, **GREEDY)
        assert again.timings.reuse_source == "ram"
        assert again.timings.reused_tokens > 200
        stats = server.stats()
        assert stats["num_ram_restores"] >= 1
        assert 0 < stats["ram_cache_bytes"] <= 64 * 1024 * 1024


def test_a_chat_keeps_its_history_when_another_chat_takes_its_slot(model_path: Path) -> None:
    system = "<|im_start|>system\n" + "You answer in one short sentence. " * 20 + "<|im_end|>\n"
    with Server(model_path, n_ctx=2048, n_parallel=1, n_batch=512,
                prompt_cache_ram_mb=64) as server:
        server.wait_ready(60)
        a = system + chat(server, "Describe the moon: its phases, its tides, its craters, its "
                                  "orbit, its far side, and the landings on it, in detail.")
        first = server.complete(a, max_tokens=16, **GREEDY)
        server.complete(system + chat(server, "Name a colour."), max_tokens=2, **GREEDY)
        a2 = a + first.text + "<|im_end|>\n" + chat(server, "And the sun?")
        again = server.complete(a2, max_tokens=2, **GREEDY)
        assert again.timings.reuse_source == "ram"
        assert again.timings.reused_tokens >= len(server.model.tokenize(a, parse_special=True))
