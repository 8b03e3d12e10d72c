"""``--cache-report exact|coarse|off`` on the fake backend: what every route says about reuse.

The oracle the option closes: a client that guesses another request's prompt learns from the
reported reuse how many leading tokens it guessed right. Here a "victim" request in a fresh
cache scope leaves a prompt in the KV cache, then a guess that shares its first 130 or 200
characters follows it. ``coarse`` must report the two guesses alike on every route, streamed or
not (both match between 128 and 255 tokens), ``off`` must report no reuse at all, and
``exact`` (the control) tells them apart.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fake_http import FakeApp, fake_app, sse_events

from llamapy.engine import RequestTimings
from llamapy.openai_api.cache_report import REPORT_BLOCK, reported_timings

#: The victim's prompt: 300 characters (tokens: the fake tokenizer is byte-wise).
SECRET = "".join(random.Random(27).choice("abcdefghij") for _ in range(300))
#: Characters of the secret two guesses share with it.
GUESSES = (130, 200)
#: Keys whose values tell about reuse, wherever they appear in a response.
CACHE_KEYS = frozenset({"cache_n", "cache_inflight_n", "cache_source", "cache_diverged_at",
                        "prompt_n", "cached_tokens", "cache_read_input_tokens",
                        "cache_creation_input_tokens", "input_tokens", "prompt_progress"})
CACHE_HEADERS = ("x-llamapy-cache-tokens", "x-llamapy-cache-source",
                 "x-llamapy-cache-diverged-at", "x-llamapy-prompt-computed")

_scopes = itertools.count()

Body = Callable[[str], dict[str, Any]]
#: Each route as ``(path, body of a prompt text)``; streamed bodies ask for every report.
ROUTES: dict[str, tuple[str, Body]] = {
    "chat": ("/v1/chat/completions", lambda text: {
        "messages": [{"role": "user", "content": text}], "max_tokens": 3}),
    "chat-stream": ("/v1/chat/completions", lambda text: {
        "messages": [{"role": "user", "content": text}], "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True}, "timings_per_token": True}),
    "completions": ("/v1/completions", lambda text: {"prompt": text, "max_tokens": 3}),
    "completions-stream": ("/v1/completions", lambda text: {
        "prompt": text, "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True}}),
    "native": ("/completion", lambda text: {"prompt": text, "n_predict": 3}),
    "native-stream": ("/completion", lambda text: {
        "prompt": text, "n_predict": 3, "stream": True, "timings_per_token": True}),
    "messages": ("/v1/messages", lambda text: {
        "model": "fake", "max_tokens": 3, "messages": [{"role": "user", "content": text}]}),
    "messages-stream": ("/v1/messages", lambda text: {
        "model": "fake", "max_tokens": 3, "stream": True,
        "messages": [{"role": "user", "content": text}]}),
    "responses": ("/v1/responses", lambda text: {"input": text, "max_output_tokens": 3}),
    "responses-stream": ("/v1/responses", lambda text: {
        "input": text, "max_output_tokens": 3, "stream": True, "timings_per_token": True}),
}


@pytest.fixture(scope="module", params=["exact", "coarse", "off"])
def reporting(request: pytest.FixtureRequest) -> Iterator[FakeApp]:
    """The fake app with each ``cache_report``."""
    with fake_app(app_options={"cache_report": request.param}) as app:
        yield app


def guess(matching: int) -> str:
    """A prompt as long as the secret that shares its first ``matching`` characters."""
    return SECRET[:matching] + "Z" * (len(SECRET) - matching)


def documents(response: httpx.Response) -> list[Any]:
    """The JSON documents of a response: the body, or each SSE event's data."""
    if response.headers["content-type"].startswith("text/event-stream"):
        return [json.loads(data) for _, data in sse_events(response.text) if data != "[DONE]"]
    return [response.json()]


def cache_facts(value: Any) -> Iterator[tuple[str, str]]:
    """Every ``(key, value)`` about reuse in a JSON document (at any depth)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in CACHE_KEYS:
                yield key, json.dumps(item, sort_keys=True)
            else:
                yield from cache_facts(item)
    elif isinstance(value, list):
        for item in value:
            yield from cache_facts(item)


def report(app: FakeApp, route: str, matching: int) -> tuple[list[tuple[str, str]], httpx.Response]:
    """What ``route`` reports of a guess sharing ``matching`` characters with the secret,
    asked right after the secret, in a scope of their own."""
    path, body = ROUTES[route]
    scope = f"trial-{next(_scopes)}"
    seeded = app.send("POST", path, json={**body(SECRET), "cache_scope": scope})
    assert seeded.status_code == 200, seeded.text
    r = app.send("POST", path, json={**body(guess(matching)), "cache_scope": scope})
    assert r.status_code == 200, r.text
    facts = [fact for doc in documents(r) for fact in cache_facts(doc)]
    facts += [(h, r.headers[h]) for h in CACHE_HEADERS if h in r.headers]
    return facts, r


@pytest.mark.parametrize("route", list(ROUTES))
def test_coarse_and_off_report_two_guesses_in_one_block_alike(reporting: FakeApp, route: str):
    (a, _), (b, _) = (report(reporting, route, n) for n in GUESSES)
    assert a, "the response says nothing about reuse"
    mode = reporting.app_options["cache_report"]
    if mode == "exact":  # the control: the oracle is there to close
        assert a != b
    else:
        assert a == b
    reporting.check_idle()


def _timings(r: httpx.Response) -> dict[str, Any]:
    return next(doc["timings"] for doc in reversed(documents(r)) if "timings" in doc)


def test_coarse_rounds_every_count_down_to_a_block_and_counts_the_rest_as_computed():
    with fake_app(app_options={"cache_report": "coarse"}) as app:
        _, r = report(app, "chat", GUESSES[0])
        body = r.json()
        timings, usage = body["timings"], body["usage"]
        assert timings["cache_n"] == REPORT_BLOCK == usage["prompt_tokens_details"]["cached_tokens"]
        assert timings["prompt_n"] == usage["prompt_tokens"] - REPORT_BLOCK
        assert timings["cache_diverged_at"] == REPORT_BLOCK and "cache_source" not in timings
        assert r.headers["x-llamapy-cache-tokens"] == str(REPORT_BLOCK)
        assert r.headers["x-llamapy-cache-source"] == "none"
        assert r.headers["x-llamapy-prompt-computed"] == str(timings["prompt_n"])
        _, r = report(app, "messages", GUESSES[1])
        usage = r.json()["usage"]
        assert usage["cache_read_input_tokens"] == REPORT_BLOCK
        assert usage["input_tokens"] + REPORT_BLOCK == _prompt_tokens(app, guess(GUESSES[1]))
        app.check_idle()


def _prompt_tokens(app: FakeApp, text: str) -> int:
    r = app.send("POST", "/v1/messages/count_tokens",
                 json={"model": "fake", "messages": [{"role": "user", "content": text}]})
    return int(r.json()["input_tokens"])


def test_off_reports_no_reuse_anywhere():
    with fake_app(app_options={"cache_report": "off"}) as app:
        _, r = report(app, "native", len(SECRET))  # the whole prompt matches
        timings = r.json()["timings"]
        assert timings["cache_n"] == 0 and timings["prompt_n"] == len(SECRET)
        assert timings["cache_diverged_at"] == 0 and "cache_source" not in timings
        assert r.headers["x-llamapy-cache-tokens"] == "0"
        assert r.headers["x-llamapy-cache-source"] == "none"
        assert app.server.stats()["num_reused_tokens"] > 0  # the engine did reuse it
        app.check_idle()


def progress(app: FakeApp, matching: int) -> list[dict[str, int]]:
    """The ``prompt_progress`` of a streamed ``/completion`` of a guess."""
    path, body = ROUTES["native-stream"]
    scope = f"trial-{next(_scopes)}"
    app.send("POST", path, json={**body(SECRET), "cache_scope": scope})
    r = app.send("POST", path, json={**body(guess(matching)), "cache_scope": scope,
                                     "return_progress": True})
    return [doc["prompt_progress"] for doc in documents(r) if "prompt_progress" in doc]


@pytest.mark.parametrize("mode", ["coarse", "off"])
def test_prompt_progress_starts_at_the_shown_reuse_and_ends_at_the_whole_prompt(mode: str):
    shown = REPORT_BLOCK if mode == "coarse" else 0
    chunk = 64  # the fake app's chunk_size: tokens computed per progress event
    with fake_app(app_options={"cache_report": mode}) as app:
        for matching in GUESSES:
            events = progress(app, matching)
            assert {e["cache"] for e in events} == {shown}
            assert events[0]["processed"] == shown and events[-1]["processed"] == len(SECRET)
            assert all((e["processed"] - shown) % chunk == 0 for e in events[:-1])
        app.check_idle()


def test_an_exact_report_is_the_engines_own():
    with fake_app() as app:
        _, r = report(app, "native", GUESSES[0])
        timings = r.json()["timings"]
        assert timings["cache_n"] == GUESSES[0] and timings["cache_source"] in ("own", "donor")


@pytest.mark.parametrize("reused,inflight,prefill", [(0, 0, 300), (127, 0, 173), (130, 0, 170),
                                                     (100, 100, 100), (300, 40, 1)])
def test_reported_timings_keep_the_prompt_and_round_the_match(reused: int, inflight: int,
                                                               prefill: int):
    timings = RequestTimings(prompt_tokens=reused + inflight + prefill, reused_tokens=reused,
                             inflight_tokens=inflight, prefill_tokens=prefill,
                             reuse_source="own" if reused else None)
    for mode in ("coarse", "off"):
        shown = reported_timings(timings, mode)
        matched = shown.reused_tokens + shown.inflight_tokens
        assert shown.reused_tokens + shown.inflight_tokens + shown.prefill_tokens \
            == timings.prompt_tokens
        assert matched % REPORT_BLOCK == 0 and matched <= reused + inflight < matched + (
            REPORT_BLOCK if mode == "coarse" else 10**9)
        assert shown.reuse_source is None and shown.reused_tokens <= reused
    assert reported_timings(timings, "off").prefill_tokens == timings.prompt_tokens
    assert reported_timings(timings, "exact") is timings


def test_an_unknown_cache_report_fails_at_startup():
    from llamapy.errors import InvalidOptionError
    from llamapy.openai_api import ServedModel
    from llamapy.server.fake import fake_server

    with fake_server() as server, pytest.raises(InvalidOptionError, match="cache_report"):
        ServedModel(server, cache_report="fuzzy")


def test_the_cache_report_flag_reaches_the_served_model():
    from llamapy.serve.cli import build_parser
    from llamapy.serve.flags.serving import app_options

    assert app_options(build_parser().parse_args([]))["cache_report"] == "exact"
    flags = build_parser().parse_args(["--cache-report", "coarse"])
    assert app_options(flags)["cache_report"] == "coarse"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--cache-report", "fuzzy"])
