"""Requests of ``bench/soak.py --tenants``: the good tenant's chats and the bad tenant's
hostile classes.

The good tenant sends small valid chats one after another (fixed short prompts, ``max_tokens``
16, temperature 0), so its latency is comparable from one request to the next. The bad tenant
sends, besides the valid mix of ``soak_inputs.valid``, requests of these classes (each a
:class:`Hostile`: its class, the statuses it may get, and how to build it):

- ``trigger``: grammar trigger patterns that backtrack exponentially in a backtracking regex
  engine (200, promptly), and a look-around (400);
- ``pull``: Hub names from a tenant key (``/api/pull``, a chat's ``model``): 403 or 404, and
  never a connection to the Hub;
- ``media``: remote image URLs spelling the loopback in other ways: 400 (remote media is
  refused, or there is no media support);
- ``slot file``: ``POST /slots/{id}?action=save`` of one of the tenant's own slots (as its
  ``/slots`` shows them) with a new filename each time: 2xx until the tenant's quota, then
  4xx (403 when the slot had changed hands);
- ``id_slot``: a chat naming a slot the other tenant holds: 403 (200 when it had emptied);
- ``keep_alive``: Ollama ``/api/generate`` with ``keep_alive: 0``: 200 or 403 (the shared
  model must not go away under the other tenant);
- ``read``: ``GET /props``, ``/metrics?model=x``, ``/slots`` with the tenant's key.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, replace

from soak_inputs import CHAT, Req

#: The good tenant's prompts, sent in turn.
GOOD_PROMPTS = ("Say hi.", "Name a colour.", "Count to three.", "What is two plus two?")
GOOD_MAX_TOKENS = 16

TRIGGER_BOMBS = ("(" * 250 + "a" + ")" * 250, ".{32}(.|.|.)*x", "(x+x+)+y")
LOOK_AROUND = "a(?!b)"
MEDIA_URLS = ("http://0177.0.0.1/x.png", "http://[::ffff:127.0.0.1]/x.png",
              "http://64:ff9b::7f00:1/x.png", "http://localhost:1/x.png")


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("Authorization", f"Bearer {key}"),)


def with_key(req: Req, key: str) -> Req:
    """``req`` sent with ``key``."""
    return replace(req, headers=req.headers + bearer(key))


def _body(model: str | None, **fields: object) -> dict[str, object]:
    return {**({"model": model} if model else {}), **fields}


def _chat(model: str | None, content: object = "Say hi.", max_tokens: int = 8,
          **extra: object) -> dict[str, object]:
    return _body(model, messages=[{"role": "user", "content": content}],
                 max_tokens=max_tokens, **extra)


def good_chats(model: str | None, key: str) -> itertools.cycle[Req]:
    """The good tenant's requests, endlessly in turn."""
    reqs = [Req("good chat", CHAT, json.dumps(_chat(
        model, prompt, max_tokens=GOOD_MAX_TOKENS, temperature=0.0)).encode(),
        headers=bearer(key)) for prompt in GOOD_PROMPTS]
    return itertools.cycle(reqs)


@dataclass(frozen=True, slots=True)
class Hostile:
    """A hostile request: its class, the answers expected (statuses, or ``2xx`` / ``4xx``),
    and how to build it (``build(n, slot)``: ``n`` counts the requests sent; ``slot``, for the
    ``id_slot`` class a slot the other tenant holds, for ``slot file`` one of the tenant's
    own)."""

    name: str
    klass: str
    expected: frozenset[str]
    build: Callable[[int, int], Req]

    def accepts(self, status: str) -> bool:
        return status in self.expected or f"{status[0]}xx" in self.expected


def _fixed(name: str, path: str, body: object, key: str) -> Callable[[int, int], Req]:
    return _always(Req(name, path, json.dumps(body).encode(), headers=bearer(key)))


def _always(req: Req) -> Callable[[int, int], Req]:
    return lambda n, slot: req


def as_hostile(req: Req, klass: str, expected: frozenset[str]) -> Hostile:
    """``req`` (named by its kind), sent as it is each time."""
    return Hostile(req.kind, klass, expected, _always(req))


def _get(name: str, path: str, key: str) -> Callable[[int, int], Req]:
    return _always(Req(name, path, b"", mode="get", headers=bearer(key)))


def _triggers(model: str | None, key: str) -> list[Hostile]:
    out = []
    for pattern in (*TRIGGER_BOMBS, LOOK_AROUND):
        body = _chat(model, grammar='root ::= "x"', grammar_triggers=[pattern])
        name = "trigger " + (pattern if len(pattern) < 40 else "(*250 a )*250")
        expected = frozenset({"400"} if pattern == LOOK_AROUND else {"200"})
        out.append(Hostile(name, "trigger", expected, _fixed(name, CHAT, body, key)))
    return out


def _pulls(key: str) -> list[Hostile]:
    refused = frozenset({"403", "404"})
    return [
        Hostile("pull hf.co/evil/x", "pull", refused,
                _fixed("pull hf.co/evil/x", "/api/pull", {"model": "hf.co/evil/x"}, key)),
        Hostile("pull ORG/REPO", "pull", refused,
                _fixed("pull ORG/REPO", "/api/pull", {"model": "ORG/REPO"}, key)),
        Hostile("chat model hf.co/a/b", "pull", refused,
                _fixed("chat model hf.co/a/b", CHAT, _chat("hf.co/a/b"), key)),
    ]


def _media(model: str | None, key: str) -> list[Hostile]:
    out = []
    for url in MEDIA_URLS:
        parts = [{"type": "text", "text": "What is this?"},
                 {"type": "image_url", "image_url": {"url": url}}]
        name = f"image {url}"
        out.append(Hostile(name, "media", frozenset({"400"}),
                           _fixed(name, CHAT, _chat(model, parts), key)))
    return out


def _stateful(model: str | None, key: str) -> list[Hostile]:
    def save(n: int, slot: int) -> Req:
        return Req("slot save f{n}.bin", f"/slots/{slot}?action=save",
                   json.dumps({"filename": f"f{n}.bin"}).encode(), headers=bearer(key))

    def id_slot(n: int, slot: int) -> Req:
        return Req("chat id_slot of the other tenant", CHAT,
                   json.dumps(_chat(model, id_slot=slot)).encode(), headers=bearer(key))

    generate = _body(model, prompt="hi", keep_alive=0, stream=False,
                     options={"num_predict": 4})
    return [
        Hostile("slot save f{n}.bin", "slot file", frozenset({"2xx", "4xx"}), save),
        Hostile("chat id_slot of the other tenant", "id_slot", frozenset({"200", "403"}),
                id_slot),
        Hostile("ollama generate keep_alive 0", "keep_alive", frozenset({"200", "403"}),
                _fixed("ollama generate keep_alive 0", "/api/generate", generate, key)),
    ]


def _reads(key: str) -> list[Hostile]:
    return [Hostile("GET /props", "read", frozenset({"200", "403"}),
                    _get("GET /props", "/props", key)),
            Hostile("GET /metrics?model=x", "read", frozenset({"403"}),
                    _get("GET /metrics?model=x", "/metrics?model=x", key)),
            Hostile("GET /slots", "read", frozenset({"200"}), _get("GET /slots", "/slots", key))]


def tenant_hostile(model: str | None, key: str) -> list[Hostile]:
    """Every hostile request of the bad tenant (``model``: the name its chats send, None for
    none), in a fixed order."""
    return [*_triggers(model, key), *_pulls(key), *_media(model, key),
            *_stateful(model, key), *_reads(key)]
