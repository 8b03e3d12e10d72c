"""Agent loops on the fake backend: more agents than slots, each turn the last one's prompt and
answer plus a tool result. An agent's KV survives the gap between its turns (on its slot, else
in the RAM cache), and a new agent takes the slot of the conversation idle longest."""

from __future__ import annotations

from engine_helpers import make_engine, submit

from llamapy.engine import DoneEvent
from llamapy.engine.testing import drain

SYSTEM = list(range(1, 121))  # the stable system prompt every agent shares


def tool_result(agent: int, turn: int) -> list[int]:
    return [(200 + 13 * agent + 7 * turn + i) % 500 + 1 for i in range(30)]


def test_every_later_turn_reuses_its_whole_history_with_more_agents_than_slots():
    engine, _ = make_engine(n_ctx=8192, n_parallel=4, prompt_cache_ram_mb=64)
    history = {a: [*SYSTEM, 400 + a] for a in range(6)}
    for turn in range(4):
        for agent in range(6):  # each agent's gap lets the other five run
            prompt = history[agent] + tool_result(agent, turn)
            sink = submit(engine, (agent, turn), prompt, max_tokens=5, session=f"agent-{agent}")
            drain(engine)
            done = sink.final
            assert isinstance(done, DoneEvent)
            if turn:
                # everything computed before is reused (the answer's last token was sampled,
                # never decoded): nothing is computed twice
                assert done.timings.reused_tokens == len(history[agent]) - 1, (agent, turn)
            history[agent] = prompt + sink.tokens
    assert engine.counters.restores["ram"] > 0  # two of six agents had to come from RAM


def test_a_new_agent_takes_the_slot_of_the_conversation_idle_longest():
    engine, _ = make_engine(n_ctx=4096, n_parallel=3, prompt_cache_ram_mb=64)
    slots = {}
    for agent in range(3):
        sink = submit(engine, agent, [*SYSTEM, 400 + agent], max_tokens=2,
                      session=f"agent-{agent}")
        drain(engine)
        slots[agent] = sink.final.timings.slot_id  # type: ignore[union-attr]
    again = submit(engine, "again", [*SYSTEM, 400, 5], max_tokens=2, session="agent-0")
    drain(engine)  # agent 0 came back: agent 1 is now the longest idle
    assert again.final.timings.slot_id == slots[0]  # type: ignore[union-attr]
    new = submit(engine, "new", [*SYSTEM, 403], max_tokens=2, session="agent-3")
    drain(engine)
    assert new.final.timings.slot_id == slots[1]  # type: ignore[union-attr]
