"""No request can break the server: a fuzzer over every route of the app on the fake backend.

Each example sends one mutated request (:func:`fuzz_routes.cases`: a valid body with fields
set to wrong types, nested containers, huge or negative ints, NaN and infinities, long strings
and lists, unknown fields, fields removed or replaced deep down; or a hostile whole body, raw
bytes, odd headers and content types, odd path parameters) and asserts:

- the answer is a 2xx, or a 4xx in the route's own error shape (OpenAI's, which
  llama-server's routes share, or Anthropic's); a 5xx only where the route documents it; a
  stream never reports a server error;
- the next valid request succeeds;
- nothing leaks: once idle, no slot, queue entry, lease, sampler or KV cell is left (the
  engine's and the fake backend's ``check_integrity()``, run on the tick thread);
- it ends in bounded time: each request is answered within ``fake_http.SEND_BOUND_S`` (a
  bound enforced with a timeout, not a speed figure), and a dead tick thread fails the example
  at once.

:func:`test_each_field_takes_each_hostile_value` runs the same checks as a systematic sweep
(:func:`fuzz_routes.sweep_cases`): every field of every route set to one value of each hostile
class, odd whole bodies, odd path parameters. A random search rarely hits one field with one
class of value (the ``session`` bug below took it 5,000 to 15,000 examples on the chat route
alone); the sweep hits each pair every run.

Profiles (``tests/conftest.py``): ``dev`` (default, 60 examples), ``ci`` (300, derandomized:
the same examples every run) and ``hunt`` (3,000 new examples per run, for long searches):
``HYPOTHESIS_PROFILE=hunt python3 -m pytest tests/http_fake/test_http_fake_fuzz.py -k breaks``.

On the code before issue 32's fixes (2 cores, ``ci``, ~40 s for the file): the sweep fails on
every generating route with ``Case(method='POST', route='/v1/chat/completions',
path='/v1/chat/completions', body={'messages': [{'role': 'user', 'content': 'hi'}],
'max_tokens': 4, 'session': [[1]]})`` (the tick thread dies: ``SlotPool._affine_slot`` hashes
the list; found in the first seconds), among other 500s (``dry_sequence_breakers: 1.5``;
``/completion`` with ``stop: 1.5``, ``n_probs: "x"``, ``model: [[1]]``; ``/tokenize`` and
``/detokenize`` with a body that is not an object). The random test's first ``ci`` failure
there is ``/tokenize`` with ``body=False`` (a 500), in ~10 s.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_http import CHAT, FakeApp
from fuzz_routes import (
    NOT_FUZZED,
    ROUTES,
    Case,
    Route,
    cases,
    check_answer,
    route_of,
    sweep_cases,
)
from hypothesis import event, given
from starlette.routing import Route as StarletteRoute

#: Paths served by the same handler as another path in the catalogue (not swept twice).
ALIASES = frozenset({"/chat/completions", "/responses", "/responses/input_tokens",
                     "/chat/completions/input_tokens", "/completions"})
SWEPT = tuple(r for r in ROUTES if r.path not in ALIASES and not r.path.startswith(("/responses/",
              "/conversations")) and (r.body is not None or "{" in r.path))


class Apps:
    """A healthy :class:`FakeApp` for each example: the same one while examples pass, a
    fresh one after a failure (a dead or leaking server must not fail the next example)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._app: FakeApp | None = None

    def get(self) -> FakeApp:
        """The current app, or a fresh one if there is none or its tick thread died."""
        if self._app is None or not self._app.alive:
            self.discard()
            self._app = FakeApp(slot_folder=self.folder, options={"mmproj": "fake-audio"},
                                app_options={"media_remote": True})  # URLs: public only
        return self._app

    def discard(self) -> None:
        """Drop the current app (the next :meth:`get` makes another)."""
        if self._app is not None:
            self._app.close()
        self._app = None


@pytest.fixture(scope="module")
def apps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Apps]:
    """The apps of this module (slot files in a temporary folder)."""
    holder = Apps(tmp_path_factory.mktemp("fuzz-slots"))
    yield holder
    holder.discard()


def check_case(app: FakeApp, case: Case) -> None:
    """The fuzzer's property for one request (see the module docstring)."""
    check_answer(route_of(case), case.send(app))
    after = app.send("POST", "/v1/chat/completions", json=CHAT)
    assert after.status_code == 200, f"the next valid request failed: {after.text[:500]}"
    app.check_idle()


@given(case=cases())
def test_no_request_breaks_the_server(apps: Apps, case: Case) -> None:
    """The fuzzer's property (see the module docstring) for one random case."""
    event(f"route: {case.method} {case.route}")
    app = apps.get()
    try:
        check_case(app, case)
    except BaseException:
        apps.discard()
        raise


@pytest.mark.parametrize("route", SWEPT, ids=lambda r: f"{r.method} {r.path}")
def test_each_field_takes_each_hostile_value(apps: Apps, route: Route) -> None:
    """The sweep of ``route`` (:func:`fuzz_routes.sweep_cases`: every field set to one value
    of each hostile class, odd whole bodies, odd path parameters), one request at a time;
    every failing case is reported (a dead or unclean server is replaced to go on)."""
    failures = []
    for case in sweep_cases(route):
        try:
            check_answer(route, case.send(apps.get()))
            apps.get().check_idle()
        except AssertionError as exc:
            failures.append(f"{short(case)}\n    {str(exc)[:300]}")
            apps.discard()
    check_case(apps.get(), Case("POST", "/v1/chat/completions", "/v1/chat/completions", CHAT))
    assert not failures, f"{len(failures)} failing cases:\n" + "\n".join(failures)


def short(case: Case) -> str:
    """A case's repr, long values cut."""
    text = repr(case)
    return text if len(text) < 400 else text[:400] + " ..."


def test_the_fuzzer_covers_every_route(apps: Apps) -> None:
    """Each route the app serves is in the catalogue, or in ``NOT_FUZZED`` with a reason (the
    static files' mount is not a route: files only)."""
    app = apps.get().client.app
    served = {(method, route.path) for route in app.routes  # type: ignore[attr-defined]
              if isinstance(route, StarletteRoute) for method in route.methods or ()
              if method != "HEAD"}
    assert served - {(r.method, r.path) for r in ROUTES} - set(NOT_FUZZED) == set()
    assert {(r.method, r.path) for r in ROUTES} <= served
