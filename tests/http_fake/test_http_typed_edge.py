"""Every API hands the server one typed value per request: each route's generation reaches
``Server`` as a ``GenerationIntent`` (resolved once, by ``ServedModel.intent``), never as
keyword options (fake backend)."""

from __future__ import annotations

from typing import Any

import pytest
from fake_http import ALIAS, FakeApp

from llamapy.server import GenerationIntent

USER = [{"role": "user", "content": "hi"}]

#: (path, body) of each API's generation routes, whole and streamed.
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 3, "n": 2, "seed": 4}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 3, "stream": True}),
    ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 3}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 3, "stream": True}),
    ("/v1/messages", {"messages": USER, "max_tokens": 3}),
    ("/v1/messages", {"messages": USER, "max_tokens": 3, "stream": True}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 16}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 16, "stream": True}),
    ("/api/chat", {"messages": USER, "options": {"num_predict": 3}, "stream": False}),
    ("/api/generate", {"prompt": "hi", "options": {"num_predict": 3}}),
    ("/completion", {"prompt": ["a", "b"], "n_predict": 3}),
    ("/completion", {"prompt": "a", "n_predict": 3, "stream": True}),
]

METHODS = ("open_stream", "open_astream", "complete_tokens", "acomplete_tokens")


def calls_made(app: FakeApp, monkeypatch: pytest.MonkeyPatch, path: str,
               body: dict[str, Any]) -> list[tuple[object, dict[str, object]]]:
    """``(intent, keyword options)`` of every generation call the route made."""
    seen: list[tuple[object, dict[str, object]]] = []
    for name in METHODS:
        original = getattr(app.server, name)

        def spy(token_ids: object, intent: object = None, *, _original: Any = original,
                **options: Any) -> Any:
            seen.append((intent, dict(options)))
            return _original(token_ids, intent, **options)

        monkeypatch.setattr(app.server, name, spy)
    answer = app.send("POST", path, json={"model": ALIAS, **body})
    assert answer.status_code == 200, answer.text
    return seen


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_every_route_hands_the_server_a_typed_intent(
        app: FakeApp, monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]) -> None:
    seen = calls_made(app, monkeypatch, path, body)
    assert seen, f"{path} made no generation call"
    for intent, options in seen:
        assert isinstance(intent, GenerationIntent), (path, intent)
        assert options in ({}, {"per_event": True}, {"per_event": False}), (path, options)
    app.check_idle()


def test_choices_differ_only_by_their_seed(app: FakeApp, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    seen = calls_made(app, monkeypatch, "/v1/chat/completions",
                      {"messages": USER, "max_tokens": 3, "n": 3, "seed": 9, "top_k": 7})
    intents = [intent for intent, _ in seen]
    assert [i.options.sampling.seed for i in intents] == [9, 10, 11]  # type: ignore[union-attr]
    settings = [i.settings() for i in intents]  # type: ignore[union-attr]
    for one in settings:
        one.pop("seed")
    assert settings[0]["top_k"] == 7 and settings[0] == settings[1] == settings[2]
    app.check_idle()


def test_generation_settings_report_every_option(app: FakeApp) -> None:
    done = app.send("POST", "/completion", json={"prompt": "a", "n_predict": 2, "top_k": 3})
    settings = done.json()["generation_settings"]
    assert settings["n_predict"] == 2 and settings["top_k"] == 3
    defaults = app.server.start_options.engine.sampling
    assert settings["min_p"] == defaults.min_p and settings["temp"] == defaults.temp
    app.check_idle()
