"""The rerank routes on a fake server that ranks (``pooling_type="rank"``: the fake backend
pools, so the pairs go through the engine as a reranker's do): the fuzzer's sweep and random
cases, with the checks of ``test_http_fake_fuzz.py`` (a 2xx or a 4xx in shape, never a 5xx
here; the next valid rerank succeeds; nothing is left in the engine once idle).

The fake model scores nothing for a reason (its outputs are hashes of the pairs' tokens):
these tests prove the serving path's hardening, not ranking.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from fake_http import FakeApp
from fuzz_routes import ROUTES, Case, check_answer, sweep_cases
from fuzz_routes import cases as route_cases
from hypothesis import given

RERANK = tuple(dataclasses.replace(r, allowed_5xx=frozenset())
               for r in ROUTES if r.path in ("/v1/rerank", "/rerank"))
VALID = {"query": "q", "documents": ["a b", "c", {"text": "d e f"}]}


@pytest.fixture(scope="module")
def app() -> Iterator[FakeApp]:
    with FakeApp(options={"pooling_type": "rank", "n_parallel": 2}) as fake:
        yield fake


def _check(app: FakeApp, case: Case) -> None:
    route = next(r for r in RERANK if r.path == case.route)
    check_answer(route, case.send(app))
    after = app.send("POST", "/rerank", json=VALID)
    assert after.status_code == 200, after.text[:300]
    assert sorted(r["index"] for r in after.json()["results"]) == [0, 1, 2]
    app.check_idle()


def test_a_ranking_fake_server_scores_through_its_engine(app: FakeApp) -> None:
    answer = app.send("POST", "/v1/rerank", json={**VALID, "top_n": 2})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert len(body["results"]) == 2 and body["usage"]["prompt_tokens"] > 0
    assert app.server.stats()["num_finished"] >= 3  # one pooled request per pair


@pytest.mark.parametrize("route", RERANK, ids=lambda r: r.path)
def test_each_field_takes_each_hostile_value(app: FakeApp, route: object) -> None:
    for case in sweep_cases(route):  # type: ignore[arg-type]
        _check(app, case)


@given(case=route_cases(RERANK))
def test_no_rerank_request_breaks_the_server(app: FakeApp, case: Case) -> None:
    _check(app, case)
