"""A multi-turn chat workload over HTTP: conversations sharing a system prompt, each turn sent
with the whole history, streamed; per turn: the replica that served it, its TTFT and its cached
prompt tokens. Used by the Ray Serve tests and ``bench/ray_affinity.py``."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from llamapy.ray.forward import REPLICA_HEADER

SYSTEM = ("You are the support assistant of ACME Cloud. Answer in one short sentence, "
          "politely, without lists. Products: ACME Compute (virtual machines), ACME Store "
          "(object storage), ACME Queue (message queues), ACME Watch (monitoring). Support "
          "hours are 8:00 to 18:00 UTC on weekdays; outside them, point to the status page. ")
TOPICS = ("resizing a virtual machine", "object storage lifecycle rules", "queue retention",
          "alert thresholds", "billing alerts", "access keys", "private networks",
          "snapshots", "regions", "quotas", "backups", "audit logs")


@dataclass(frozen=True, slots=True)
class Turn:
    """One answered turn."""

    conversation: int
    turn: int
    replica: str
    ttft_s: float
    cached_tokens: int
    prompt_tokens: int
    server_ttft_s: float = 0.0


def question(conversation: int, turn: int) -> str:
    topic = TOPICS[conversation % len(TOPICS)]
    return (f"Customer #{conversation:03d} asks (message {turn + 1}): I have a question about "
            f"{topic} for my project number {1000 + 37 * conversation}. What should I do?")


def stream_turn(client: httpx.Client, path: str, body: dict[str, Any],
                headers: dict[str, str]) -> tuple[str, float, str, dict[str, Any]]:
    """Send one streamed chat request: (replica, ttft_s, text, final timings)."""
    started = time.perf_counter()
    ttft, text, timings = None, [], {}
    with client.stream("POST", path, json=body, headers=headers) as response:
        assert response.status_code == 200, response.read()
        for chunk in _events(response.iter_lines()):
            delta = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
            if delta and ttft is None:
                ttft = time.perf_counter() - started
            text.append(delta or "")
            timings = chunk.get("timings") or timings
        replica = response.headers[REPLICA_HEADER]
    return replica, ttft if ttft is not None else time.perf_counter() - started, \
        "".join(text), timings


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


@dataclass(eq=False)
class Conversation:
    """One conversation's history and how it names its session (``header``, ``user`` or
    ``none``)."""

    index: int
    session: str
    messages: list[dict[str, str]] = field(
        default_factory=lambda: [{"role": "system", "content": SYSTEM}])

    def turn(self, base_url: str, t: int, max_tokens: int) -> Turn:
        """Ask turn ``t`` (the whole history), keep the answer in the history."""
        self.messages.append({"role": "user", "content": question(self.index, t)})
        body: dict[str, Any] = {"messages": self.messages, "max_tokens": max_tokens,
                                "temperature": 0, "stream": True}
        headers = {"x-session-id": f"conv-{self.index}"} if self.session == "header" else {}
        if self.session == "user":
            body["user"] = f"conv-{self.index}"
        with httpx.Client(base_url=base_url, timeout=120) as client:
            replica, ttft, text, timings = stream_turn(client, "/v1/chat/completions", body,
                                                       headers)
        self.messages.append({"role": "assistant", "content": text})
        cached = int(timings.get("cache_n", 0))
        return Turn(self.index, t, replica, ttft, cached, cached + int(timings.get("prompt_n", 0)),
                    float(timings.get("ttft_ms", 0.0)) / 1000)


def run_workload(base_url: str, *, conversations: int = 8, turns: int = 4,
                 concurrency: int = 4, max_tokens: int = 12,
                 sessions: tuple[str, ...] = ("user", "header"), first: int = 0) -> list[Turn]:
    """Run the conversations in rounds (turn 1 of each, then turn 2 of each, ...), ``concurrency``
    requests at a time, as interleaved users do: where a conversation's next turn lands does
    not depend on the replica it just left. Conversation ``i`` names its session the
    ``sessions[i % len(sessions)]`` way; ``first`` numbers the conversations from there (new
    ones, unknown to the caches, in each run)."""
    chats = [Conversation(i, sessions[i % len(sessions)])
             for i in range(first, first + conversations)]
    out: list[Turn] = []
    with ThreadPoolExecutor(concurrency) as pool:
        for t in range(turns):
            out += pool.map(lambda c: c.turn(base_url, t, max_tokens), chats)  # noqa: B023
    return out


def first_visits(turns: list[Turn]) -> list[Turn]:
    """The later turns served by a replica that had served none of the conversation's earlier
    turns: all such a replica can hold of the prompt is what other conversations share."""
    seen: set[tuple[int, str]] = set()
    out = []
    for t in sorted(turns, key=lambda t: (t.conversation, t.turn)):
        if t.turn > 0 and (t.conversation, t.replica) not in seen:
            out.append(t)
        seen.add((t.conversation, t.replica))
    return out


def summary(turns: list[Turn]) -> dict[str, float]:
    """Over the turns after the first of each conversation: the share served by the replica
    that served the conversation's previous turn, the share of prompt tokens read from the KV
    cache, and the TTFT median (ms)."""
    by_conv = {(t.conversation, t.turn): t for t in turns}
    later = [t for t in turns if t.turn > 0]
    same = sum(1 for t in later if by_conv[(t.conversation, t.turn - 1)].replica == t.replica)
    return {
        "turns": len(later),
        "same_replica_share": same / len(later),
        "cached_token_share": sum(t.cached_tokens for t in later)
        / max(1, sum(t.prompt_tokens for t in later)),
        "ttft_p50_ms": 1000 * statistics.median(t.ttft_s for t in later),
        "server_ttft_p50_ms": 1000 * statistics.median(t.server_ttft_s for t in later),
        "replicas": len({t.replica for t in turns}),
    }
