"""Requests for ``bench/soak.py``: the valid mix, and the hostile bodies sent at ``--bad-rate``.

A valid request is one a well-behaved client sends (a small chat, ``n=2``, two prompts on
``/completion``, two embedding inputs); a 5xx on one fails the soak. A hostile body is one an
attacker sends (issue 32's classes: values that pass a loose type check, ints that do not fit C,
options that make the tick thread or the event loop pay for their size, bodies that are not
JSON or come from a web page); any 2xx or 4xx is an acceptable answer, and each answer is
counted per body so a run shows which inputs a server still mishandles.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

CHAT = "/v1/chat/completions"
COMPLETION = "/completion"
EMBEDDINGS = "/v1/embeddings"
JSON_TYPE = "application/json"

WORDS = tuple(
    "river mountain quantum garden lantern copper violet harbor meadow signal canvas orbit "
    "pepper marble thunder cedar falcon ember glacier velvet prism comet".split()
)

#: How a valid request is sent: ``post`` (read the whole answer), ``stream`` (read every SSE
#: line), ``cancel`` (close the stream after its first chunk), ``hangup`` (drop the socket
#: mid-request, before or after the first bytes of the answer).
SEND_MODES = ("post", "stream", "cancel", "hangup")


@dataclass(frozen=True, slots=True)
class Req:
    """One request: where, what bytes, and how to send it."""

    kind: str
    path: str
    content: bytes
    mode: str = "post"
    content_type: str = JSON_TYPE
    headers: tuple[tuple[str, str], ...] = ()


def _json(body: object) -> bytes:
    return json.dumps(body).encode()


def _chat(text: str = "Say hi.", max_tokens: object = 8, **extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, **extra}


def words(rng: random.Random, n: int) -> str:
    """``n`` words from a small vocabulary (about one token each)."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


#: Valid kinds and their weights in the mix.
VALID_WEIGHTS = {"chat": 3, "chat_stream": 3, "cancel": 2, "hangup": 2, "chat_n2": 1,
                 "embeddings": 1, "completion_prompts": 1}


def valid(rng: random.Random) -> Req:
    """A random valid request (streams, cancels and hang-ups are chats)."""
    kind = rng.choices(list(VALID_WEIGHTS), weights=list(VALID_WEIGHTS.values()))[0]
    text, n_out = words(rng, rng.randint(4, 40)), rng.randint(4, 32)
    if kind == "embeddings":
        return Req(kind, EMBEDDINGS, _json({"input": [text, words(rng, 8)]}))
    if kind == "completion_prompts":
        return Req(kind, COMPLETION, _json({"prompt": [text, words(rng, 6)], "n_predict": n_out}))
    if kind == "chat_n2":
        return Req(kind, CHAT, _json(_chat(text, n_out, n=2, temperature=0.8)))
    stream = kind != "chat"
    mode = {"chat": "post", "chat_stream": "stream"}.get(kind, kind)
    return Req(kind, CHAT, _json(_chat(text, n_out, stream=stream, temperature=0.7)), mode)


def _grammar_alternatives(n: int) -> str:
    return "root ::= " + " | ".join(f'"a{i}"' for i in range(n))


#: name -> (path, body): JSON bodies.
_HOSTILE_JSON: dict[str, tuple[str, object]] = {
    "session [[1]]": (CHAT, _chat(session=[[1]])),
    "session {'a': 1}": (CHAT, _chat(session={"a": 1})),
    "top_k 2**32": (CHAT, _chat(top_k=2**32)),
    "top_k -2**40": (CHAT, _chat(top_k=-(2**40))),
    "seed 2**64": (CHAT, _chat(seed=2**64, temperature=0.7)),
    "max_tokens -5": (CHAT, _chat(max_tokens=-5)),
    "max_tokens '8'": (CHAT, _chat(max_tokens="8")),
    "n_probs 2**31": (COMPLETION, {"prompt": "hi", "n_predict": 2, "n_probs": 2**31}),
    "n_probs 100000": (COMPLETION, {"prompt": "hi", "n_predict": 4, "n_probs": 100_000}),
    "top_logprobs 2**31": (CHAT, _chat(logprobs=True, top_logprobs=2**31)),
    "64 stops of 2000 chars": (CHAT, _chat(max_tokens=16, stop=["ab" * 1000] * 64)),
    "n 128": (CHAT, _chat(max_tokens=2, n=128)),
    "n 2**31": (CHAT, _chat(max_tokens=2, n=2**31)),
    "200 prompts": (COMPLETION, {"prompt": ["hi"] * 200, "n_predict": 2}),
    "2000 embedding inputs": (EMBEDDINGS, {"input": ["hi"] * 2000}),
    "embedding input [[[1]]]": (EMBEDDINGS, {"input": [[[1]]]}),
    "messages a string": (CHAT, {"messages": "hi", "max_tokens": 4}),
    "content an object": (CHAT, {"messages": [{"role": "user", "content": {"a": 1}}]}),
    "role an int": (CHAT, {"messages": [{"role": 5, "content": "hi"}], "max_tokens": 4}),
    "temperature a list": (CHAT, _chat(temperature=[1])),
    "logit_bias 30000 entries": (CHAT, _chat(logit_bias={str(i): -1 for i in range(30_000)})),
    "logit_bias [[[1]]]": (COMPLETION, {"prompt": "hi", "n_predict": 2, "logit_bias": [[[1]]]}),
    "samplers x10000": (COMPLETION, {"prompt": "hi", "n_predict": 2,
                                     "samplers": ["top_k"] * 10_000}),
    "dry breakers x500": (COMPLETION, {"prompt": "hi", "n_predict": 2, "dry_multiplier": 0.8,
                                       "dry_sequence_breakers": ["abcdefgh"] * 500}),
    "grammar of 5000 alternatives": (COMPLETION, {"prompt": "hi", "n_predict": 2,
                                                  "grammar": _grammar_alternatives(5000)}),
    "grammar + its only piece banned": (COMPLETION, {"prompt": "hi", "n_predict": 2,
                                                     "grammar": 'root ::= "x"',
                                                     "logit_bias": [["x", False]]}),
    "unknown field": (CHAT, _chat(frobnicate=1)),
}

#: name -> (path, raw bytes, content type, extra headers): bodies that are not plain JSON.
_HOSTILE_RAW: dict[str, tuple[str, bytes, str, tuple[tuple[str, str], ...]]] = {
    "not JSON": (CHAT, b"{not json", JSON_TYPE, ()),
    "temperature NaN": (CHAT, b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,'
                              b'"temperature":NaN}', JSON_TYPE, ()),
    "JSON array body": (CHAT, b"[]", JSON_TYPE, ()),
    "nested 100000 deep": (CHAT, b"[" * 100_000 + b"]" * 100_000, JSON_TYPE, ()),
    "text/plain chat": (CHAT, _json(_chat()), "text/plain", ()),
    "text/plain session [[1]] from a page": (CHAT, _json(_chat(session=[[1]])), "text/plain",
                                             (("Origin", "http://evil.example"),)),
    "form body": (CHAT, b"messages=hi", "application/x-www-form-urlencoded", ()),
}

#: Sent only with ``--heavy``: before the bounds, llama.cpp allocates a ring buffer of this many
#: tokens (8 GiB, 16 s of tick thread), too much for a shared machine.
_HOSTILE_HEAVY: dict[str, tuple[str, object]] = {
    "penalty_last_n 2**31-1": (CHAT, _chat(penalty_last_n=2**31 - 1, repeat_penalty=1.1)),
}


def hostile_bodies(heavy: bool = False) -> list[Req]:
    """Every hostile request, in a fixed order (``kind`` is the body's name)."""
    json_bodies = {**_HOSTILE_JSON, **(_HOSTILE_HEAVY if heavy else {})}
    out = [Req(name, path, _json(body)) for name, (path, body) in json_bodies.items()]
    out += [Req(name, path, raw, content_type=ctype, headers=headers)
            for name, (path, raw, ctype, headers) in _HOSTILE_RAW.items()]
    return out
