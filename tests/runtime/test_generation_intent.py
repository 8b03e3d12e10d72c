"""``GenerationIntent``: a call's options resolved once, taken typed by every generation method
that starts from token ids (fake backend)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import pytest

from llamapy.errors import InvalidOptionError, UnknownOptionError
from llamapy.server import DEFAULT_TIMEOUT, GenerationIntent, Server
from llamapy.server.fake import fake_server

PROMPT = list(b"The countries of Europe are:")


@pytest.fixture
def server() -> Iterator[Server]:
    with fake_server(n_parallel=2, n_ctx=1024, max_n_probs=8) as s:
        s.wait_ready(10)
        yield s


def test_resolve_renames_defaults_and_checks_once(server: Server) -> None:
    intent = server.resolve(temperature=0.0, n_predict=5, seed=3)
    assert intent.options.sampling.temp == 0.0 and intent.options.max_tokens == 5
    assert intent.options.sampling.top_k == server.start_options.engine.sampling.top_k
    assert intent.timeout is DEFAULT_TIMEOUT and intent.request_id is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        intent.timeout = 3.0  # type: ignore[misc]
    with pytest.raises(UnknownOptionError):
        server.resolve(temprature=0.5)  # type: ignore[call-arg]
    with pytest.raises(InvalidOptionError):
        server.resolve(temp=0.1, temperature=0.2)  # one option under two spellings
    with pytest.raises(InvalidOptionError, match="n_probs"):
        server.resolve(n_probs=9)  # past the server's limit: refused at the edge


def test_an_intent_runs_exactly_as_its_keywords(server: Server) -> None:
    options = {"temperature": 0.9, "seed": 11, "max_tokens": 12, "top_k": 5}
    by_keywords = server.complete_tokens(PROMPT, **options)  # type: ignore[arg-type]
    intent = server.resolve(**options)  # type: ignore[arg-type]
    assert server.complete_tokens(PROMPT, intent).token_ids == by_keywords.token_ids
    with server.open_stream(PROMPT, intent) as events:
        streamed = [e.token_id for e in events if hasattr(e, "token_id")]
    assert streamed == list(by_keywords.token_ids)
    again = asyncio.run(server.acomplete_tokens(PROMPT, intent))
    assert again.token_ids == by_keywords.token_ids


def test_an_intent_and_keywords_together_are_refused(server: Server) -> None:
    intent = server.resolve(max_tokens=2)
    with pytest.raises(TypeError, match="not both"):
        server.open_stream(PROMPT, intent, max_tokens=3)
    with pytest.raises(TypeError, match="GenerationIntent"):
        server.complete_tokens(PROMPT, {"max_tokens": 2})  # type: ignore[arg-type]


def test_revise_checks_the_change_as_resolve_does(server: Server) -> None:
    intent = server.resolve(max_tokens=4, seed=1)
    revised = server.revise(intent, seed=2, n_predict=6)
    assert (revised.options.sampling.seed, revised.options.max_tokens) == (2, 6)
    assert (intent.options.sampling.seed, intent.options.max_tokens) == (1, 4)  # unchanged
    for bad in ({"max_tokens": -1}, {"n_probs": 9}, {"stop": [""]}):
        with pytest.raises(InvalidOptionError):
            server.revise(intent, **bad)
    with pytest.raises(UnknownOptionError):
        server.revise(intent, no_such_option=1)
    with pytest.raises(InvalidOptionError, match="timeout"):
        server.revise(intent, timeout=1.0)


def test_the_intents_timeout_or_the_methods_default_applies(server: Server) -> None:
    assert server.resolve().timeout_or(60.0) == 60.0
    assert server.resolve(timeout=None).timeout_or(60.0) is None
    assert server.resolve(timeout=2.5).timeout_or(60.0) == 2.5
    with pytest.raises(InvalidOptionError, match="timeout"):
        server.resolve(timeout=-1)


def test_complete_all_takes_intents_and_keywords(server: Server) -> None:
    first = server.resolve(max_tokens=3, seed=5, temperature=0.8)
    done = asyncio.run(server.acomplete_all([(PROMPT, first),
                                             (PROMPT, {"max_tokens": 3, "seed": 5,
                                                       "temperature": 0.8})]))
    assert done[0].token_ids == done[1].token_ids and len(done[0].token_ids) <= 3


def test_settings_flatten_every_option(server: Server) -> None:
    settings = server.resolve(logit_bias={3: -1.0}, stop="x").settings()
    assert settings["logit_bias"] == {3: -1.0} and settings["stop"] == ("x",)
    names = {f.name for f in dataclasses.fields(GenerationIntent(server.resolve().options)
                                                .options.sampling)}
    assert names <= set(settings) and "max_tokens" in settings and "sampling" not in settings
