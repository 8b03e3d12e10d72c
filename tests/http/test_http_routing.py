"""The app's routing: checks before handlers, JSON results, an error shape per router, the
OpenAPI document, typed 400s for bad path and query parameters, and the body validators built
after the model load."""

from __future__ import annotations

import subprocess
import sys
import threading

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.testclient import TestClient

from llamapy.errors import AuthenticationError, InvalidOptionError, LoadFailedError
from llamapy.serve.app import warm_first_request, warm_up
from llamapy.serve.errors import install_error_handlers
from llamapy.serve.host import ModelHost
from llamapy.serve.routing import Router, openapi_document
from llamapy.server import Server


def _deny_without_header(request: Request) -> None:
    if "x-ok" not in request.headers:
        raise AuthenticationError("no x-ok header")


def test_checks_run_first_and_plain_results_are_json() -> None:
    calls: list[str] = []
    router = Router(checks=[_deny_without_header])

    @router.post("/a", schema=lambda: {"type": "object"})
    @router.post("/alias", hidden=True)
    async def a(request: Request) -> dict[str, object]:
        """Answer a.

        More text that is not the summary."""
        calls.append(request.url.path)
        return {"got": await request.json()}

    app = Starlette(routes=router.routes)
    install_error_handlers(app)
    with TestClient(app) as http:
        assert http.post("/a", json=1).status_code == 401 and calls == []
        for path in ("/a", "/alias"):
            answer = http.post(path, json=[1], headers={"x-ok": "1"})
            assert answer.status_code == 200 and answer.json() == {"got": [1]}
        assert calls == ["/a", "/alias"]
        assert http.get("/a").status_code == 405
    document = openapi_document(router.endpoints, title="t", version="1", summary="s")
    assert list(document["paths"]) == ["/a"]  # the hidden alias is not documented
    operation = document["paths"]["/a"]["post"]
    assert operation["summary"] == "Answer a."
    assert operation["requestBody"]["content"]["application/json"]["schema"] == {
        "type": "object"}


def test_an_error_shape_answers_for_every_route_of_its_router() -> None:
    def shape(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"shaped": type(exc).__name__, "path": request.url.path}, 418)

    router = Router(checks=[_deny_without_header], error_shape=shape)

    @router.get("/b")
    async def b(request: Request) -> dict[str, object]:
        raise InvalidOptionError("bad", option="x")

    with TestClient(Starlette(routes=router.routes)) as http:
        assert http.get("/b").json() == {"shaped": "AuthenticationError", "path": "/b"}
        assert http.get("/b", headers={"x-ok": "1"}).json()["shaped"] == "InvalidOptionError"


def test_openapi_document_and_slot_parameters(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    assert document["info"]["title"] == "llamapy"
    paths = document["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"):
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert "properties" in schema, path
    assert "/v1/models/{model_id}" in paths and "/chat/completions" not in paths
    bad_id = http.post("/slots/abc?action=erase")
    assert bad_id.status_code == 400 and bad_id.json()["error"]["param"] == "id_slot"
    no_action = http.post("/slots/0", json={})
    assert no_action.status_code == 400 and no_action.json()["error"]["param"] == "action"


def test_body_validators_are_built_after_import_not_during_it() -> None:
    # In a fresh interpreter (this one's tests have built them): importing the app leaves the
    # request bodies' validators unbuilt; build_body_models (run by the lifespan's warm-up)
    # builds them all.
    code = ("import llamapy.serve.app as app\n"
            "assert not any(m.__pydantic_complete__ for m in app.BODY_MODELS)\n"
            "app.build_body_models()\n"
            "assert all(m.__pydantic_complete__ for m in app.BODY_MODELS)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_body_validators_wait_for_the_model_load() -> None:
    # warm_up(host) waits for the host's loader before building the validators (so schema
    # building does not hold the GIL the load's log callbacks need); a failed load counts.
    release = threading.Event()

    def loader() -> Server:
        release.wait(10)
        raise LoadFailedError("no model here")

    host = ModelHost(loader)
    assert host.wait_loaded(0.05) is False
    builder = threading.Thread(target=warm_up, args=(host,))
    builder.start()
    builder.join(0.2)
    assert builder.is_alive()  # still waiting for the load
    release.set()
    builder.join(60)
    assert not builder.is_alive() and host.wait_loaded(0) is True
    assert host.status() == "failed"


def test_the_warm_up_does_the_first_requests_one_time_work(server: Server) -> None:
    # What the first request paid before (~0.1 s here): the end-of-generation scan that
    # ignore_eos needs and anyio's asyncio backend; the lifespan's thread now does both.
    server.wait_ready(120)
    model = server.model
    model._eog = None  # as a fresh model has it
    host = ModelHost(server)  # its manager adopts the server on its load thread
    assert host.wait_loaded(60)
    warm_first_request(host.get())
    eog = model._eog
    assert eog is not None and model.eos in eog and all(model.is_eog(t) for t in eog)
    assert len(eog) == sum(model.is_eog(t) for t in range(model.n_vocab))
    assert "anyio._backends._asyncio" in sys.modules
