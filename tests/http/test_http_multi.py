"""Several models behind one app (a ModelManager): the request's model picks the server; the
budget unloads and the next request reloads; a stream in flight survives another model's load;
a broken GGUF fails alone; router mode's /models/load and /models/unload; per-model /slots,
/props, /metrics. The two models are SmolLM2 under two names (each its own Server)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from live import LiveApp

from llamapy.serve import create_app
from llamapy.serve.model_use import NAMED_MODEL, NO_MODEL, ON_MODEL, READS_MODEL
from llamapy.server import ModelManager, ModelSpec

SMALL = {"n_ctx": 512, "n_parallel": 2, "n_threads": 1, "n_batch": 256}


def chat(model: str | None, content: str = "Say hi.", **fields: object) -> dict:
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": 8, **fields}
    return body if model is None else {"model": model, **body}


def states(http: httpx.Client, prefix: str = "") -> dict[str, str]:
    return {m["id"]: m["status"]["value"]
            for m in http.get(f"{prefix}/v1/models").json()["data"]}


@pytest.fixture
def serve(model_path: Path, tmp_path: Path) -> Iterator[object]:
    """``serve(models_max=..., **app_options)``: a live app on ``one``, ``two`` and ``broken``."""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    stack: list[tuple[LiveApp, httpx.Client]] = []

    def start(models_max: int = 0, **options: object) -> httpx.Client:
        specs = [ModelSpec(name="one", path=model_path, aliases=("uno",), options=SMALL),
                 ModelSpec(name="two", path=model_path, options=SMALL),
                 ModelSpec(name="broken", path=broken, options=SMALL, memory_mb=1)]
        manager = ModelManager(specs, models_max=models_max)
        live = LiveApp(create_app(manager, own_server=True, **options)).start()  # type: ignore[arg-type]
        http = httpx.Client(base_url=live.url, timeout=120)
        stack.append((live, http))
        return http

    yield start
    for live, http in stack:
        http.close()
        live.stop()


def test_two_models_answer_alternately(serve) -> None:  # type: ignore[no-untyped-def]
    http = serve()
    assert states(http) == {"one": "unloaded", "two": "unloaded", "broken": "unloaded"}
    answers = []
    for model in ("one", "two", "uno", "two"):
        response = http.post("/v1/chat/completions", json=chat(model))
        assert response.status_code == 200, response.text
        assert response.json()["model"] in ("one", "two", "uno")
        answers.append(response.json()["choices"][0]["message"]["content"])
    assert len(set(answers)) == 1  # the same weights, greedy
    assert states(http)["one"] == states(http)["two"] == "loaded"
    assert http.post("/v1/chat/completions", json=chat(None)).status_code == 200  # the first


def test_every_api_routes_by_model(serve) -> None:  # type: ignore[no-untyped-def]
    http = serve(models_max=1)
    message = {"model": "two", "max_tokens": 4,
               "messages": [{"role": "user", "content": "Hi"}]}
    assert http.post("/v1/messages", json=message).status_code == 200
    assert states(http)["two"] == "loaded"
    response = http.post("/v1/responses", json={"model": "one", "input": "Hi",
                                                "max_output_tokens": 4})
    assert response.status_code == 200 and states(http)["one"] == "loaded"
    native = http.post("/completion", json={"model": "two", "prompt": "Hi", "n_predict": 2})
    assert native.status_code == 200 and states(http)["two"] == "loaded"
    tokens = http.post("/tokenize", json={"model": "one", "content": "Hi"})
    assert tokens.status_code == 200 and tokens.json()["tokens"]
    embedded = http.post("/v1/embeddings", json={"model": "two", "input": "Hi"})
    assert embedded.status_code == 200 and embedded.json()["data"][0]["embedding"]


def test_requests_for_a_loading_model_wait_for_it(serve) -> None:  # type: ignore[no-untyped-def]
    http = serve()
    with ThreadPoolExecutor(3) as pool:
        codes = list(pool.map(lambda _: http.post("/v1/chat/completions",
                                                  json=chat("two")).status_code, range(3)))
    assert codes == [200, 200, 200]
    assert states(http)["two"] == "loaded"


def test_unknown_model_is_a_404_listing_the_served_ones(serve) -> None:  # type: ignore[no-untyped-def]
    http = serve()
    response = http.post("/v1/chat/completions", json=chat("nope"))
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and "one, two, broken" in error["message"]
    anthropic = http.post("/v1/messages", json={"model": "nope", "max_tokens": 4,
                                                "messages": [{"role": "user", "content": "x"}]})
    assert anthropic.status_code == 404 and anthropic.json()["type"] == "error"
    assert http.get("/v1/models/nope").status_code == 404
    two = http.get("/v1/models/two")
    assert two.status_code == 200 and two.json()["status"] == {"value": "unloaded"}
    assert set(states(http).values()) == {"unloaded"}  # none of it loaded a model


def test_the_budget_unloads_and_the_next_request_reloads(serve) -> None:  # type: ignore[no-untyped-def]
    http = serve(models_max=1)
    assert http.post("/v1/chat/completions", json=chat("one")).status_code == 200
    assert http.post("/v1/completions", json={"model": "two", "prompt": "Hi",
                                              "max_tokens": 4}).status_code == 200
    assert states(http)["one"] == "unloaded" and states(http)["two"] == "loaded"
    assert http.post("/v1/chat/completions", json=chat("one")).status_code == 200
    assert states(http)["one"] == "loaded" and states(http)["two"] == "unloaded"


def test_a_stream_in_flight_survives_another_models_load(serve) -> None:  # type: ignore[no-untyped-def]
    http = serve(models_max=2)
    body = chat("one", "Count from 1 to 20.", max_tokens=48, stream=True)
    with http.stream("POST", "/v1/chat/completions", json=body) as stream:
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["object"] == "chat.completion.chunk"
        other = http.post("/v1/chat/completions", json=chat("two"))  # loads two meanwhile
        assert other.status_code == 200
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert states(http)["one"] == "loaded"


def test_a_broken_gguf_fails_alone(serve) -> None:  # type: ignore[no-untyped-def]
    http = serve()
    failed = http.post("/v1/chat/completions", json=chat("broken"))
    assert failed.status_code == 503 and "load failed" in failed.json()["error"]["message"]
    assert http.post("/v1/chat/completions", json=chat("one")).status_code == 200
    entry = next(m for m in http.get("/v1/models").json()["data"] if m["id"] == "broken")
    assert entry["status"]["value"] == "failed" and entry["status"]["error"]
    assert http.post("/models/load", json={"model": "broken"}).status_code == 503


def test_router_mode_load_and_unload(serve) -> None:  # type: ignore[no-untyped-def]
    http = serve()
    loaded = http.post("/models/load", json={"model": "two"})
    assert loaded.status_code == 200 and loaded.json()["success"] is True
    assert states(http)["two"] == "loaded"
    assert http.post("/models/unload", json={"model": "two"}).json()["success"] is True
    assert states(http)["two"] == "unloaded"
    assert http.post("/models/load", json={"model": "nope"}).status_code == 404
    assert http.post("/models/load", json={}).status_code == 400


def test_slots_props_and_metrics_per_model(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    http = serve(slot_save_path=str(tmp_path))
    slots = http.get("/slots", params={"model": "two"})
    assert slots.status_code == 200 and len(slots.json()) == 2
    assert http.get("/props", params={"model": "two"}).status_code == 200
    erased = http.post("/slots/0", params={"action": "erase", "model": "two"})
    assert erased.status_code == 200, erased.text
    per_model = http.get("/metrics", params={"model": "two"}).text
    assert "llamapy_generated_tokens_total" in per_model  # two's engine metrics
    overall = http.get("/metrics")  # no model named: no load, no engine metrics
    assert overall.status_code == 200 and "llamapy_generated_tokens_total" not in overall.text
    assert 'llamapy_model_state{model="two",state="loaded"} 1.0' in overall.text
    assert 'llamapy_model_state{model="one",state="unloaded"} 1.0' in overall.text
    assert states(http)["one"] == "unloaded"
    assert http.get("/health").json() == {"status": "ok"}


def test_the_api_key_is_checked_before_any_load(serve) -> None:  # type: ignore[no-untyped-def]
    http = serve(api_key="secret")
    assert http.post("/v1/chat/completions", json=chat("one")).status_code == 401
    assert http.get("/v1/models", headers={"Authorization": "Bearer secret"}).status_code == 200
    authed = http.post("/v1/chat/completions", json=chat("one"),
                       headers={"Authorization": "Bearer secret"})
    assert authed.status_code == 200


@pytest.mark.second_model
def test_two_families_answer_alternately_over_http(model_path: Path,
                                                   second_model_path: Path) -> None:
    specs = [ModelSpec(name="smol", path=model_path, options=SMALL),
             ModelSpec(name="gemma", path=second_model_path, options=SMALL)]
    with LiveApp(create_app(ModelManager(specs, models_max=1), own_server=True)) as live, \
            httpx.Client(base_url=live.url, timeout=120) as http:
        for model in ("smol", "gemma", "smol", "gemma"):
            response = http.post("/v1/chat/completions", json=chat(model))
            assert response.status_code == 200, response.text
            assert states(http)[model] == "loaded"
        props = http.get("/props", params={"model": "gemma"}).json()
        assert "gemma" in props["model_path"]
        assert states(http) == {"smol": "unloaded", "gemma": "loaded"}


#: What each route needed of the model when the path lists were in ``multi.py`` and
#: ``sleep.py`` (LEASE_PATHS, NAMED_LEASE_PATHS, ADMIN_LEASE_PATHS, WAKE_PATHS): the routes'
#: own declarations must give the same.
BEFORE_DECLARATIONS = {
    # NO_MODEL
    "/": NO_MODEL, "/api/copy": NO_MODEL, "/api/create": NO_MODEL, "/api/delete": NO_MODEL,
    "/api/ps": NO_MODEL, "/api/pull": NO_MODEL, "/api/push": NO_MODEL, "/api/tags": NO_MODEL,
    "/api/version": NO_MODEL, "/conversations": NO_MODEL,
    "/conversations/{conversation_id}": NO_MODEL,
    "/conversations/{conversation_id}/items": NO_MODEL,
    "/conversations/{conversation_id}/items/{item_id}": NO_MODEL, "/dashboard": NO_MODEL,
    "/health": NO_MODEL, "/models": NO_MODEL, "/models/load": NO_MODEL,
    "/models/unload": NO_MODEL, "/openapi.json": NO_MODEL, "/responses/{response_id}": NO_MODEL,
    "/responses/{response_id}/cancel": NO_MODEL, "/responses/{response_id}/input_items": NO_MODEL,
    "/v1/conversations": NO_MODEL, "/v1/conversations/{conversation_id}": NO_MODEL,
    "/v1/conversations/{conversation_id}/items": NO_MODEL,
    "/v1/conversations/{conversation_id}/items/{item_id}": NO_MODEL, "/v1/health": NO_MODEL,
    "/v1/llamapy/events": NO_MODEL, "/v1/models": NO_MODEL,
    "/v1/models/{model_id:path}": NO_MODEL, "/v1/responses/{response_id}": NO_MODEL,
    "/v1/responses/{response_id}/cancel": NO_MODEL,
    "/v1/responses/{response_id}/input_items": NO_MODEL,
    # ON_MODEL
    "/api/chat": ON_MODEL, "/api/embed": ON_MODEL, "/api/embeddings": ON_MODEL,
    "/api/generate": ON_MODEL, "/api/show": ON_MODEL, "/apply-template": ON_MODEL,
    "/chat/completions": ON_MODEL, "/chat/completions/input_tokens": ON_MODEL,
    "/completion": ON_MODEL, "/completions": ON_MODEL, "/detokenize": ON_MODEL,
    "/embeddings": ON_MODEL, "/infill": ON_MODEL, "/rerank": ON_MODEL, "/reranking": ON_MODEL,
    "/responses": ON_MODEL, "/responses/compact": ON_MODEL, "/responses/input_tokens": ON_MODEL,
    "/slots": ON_MODEL, "/slots/{id_slot}": ON_MODEL, "/tokenize": ON_MODEL,
    "/v1/chat/completions": ON_MODEL, "/v1/chat/completions/input_tokens": ON_MODEL,
    "/v1/completions": ON_MODEL, "/v1/embeddings": ON_MODEL, "/v1/messages": ON_MODEL,
    "/v1/messages/count_tokens": ON_MODEL, "/v1/rerank": ON_MODEL, "/v1/reranking": ON_MODEL,
    "/v1/responses": ON_MODEL, "/v1/responses/compact": ON_MODEL,
    "/v1/responses/input_tokens": ON_MODEL,
    # NAMED_MODEL
    "/metrics": NAMED_MODEL,
    # READS_MODEL
    "/props": READS_MODEL,
}


def test_every_route_declares_what_it_needs_of_the_model(model_path: Path) -> None:
    from starlette.routing import Route

    manager = ModelManager([ModelSpec(name="one", path=model_path)])
    app = create_app(manager, own_server=True, webui=True)
    policy = app.state.route_policy
    paths = {route.path for route in app.routes if isinstance(route, Route)}
    assert {path: policy.use(path) for path in paths} == BEFORE_DECLARATIONS
    assert policy.use("/slots/3") == ON_MODEL and policy.use("/wp-admin") == NO_MODEL
    assert policy.use("/v1/responses/resp_1") == NO_MODEL
    prefixed = create_app(manager, own_server=False, api_prefix="/llm").state.route_policy
    assert prefixed.use("/llm/v1/chat/completions") == ON_MODEL
    assert prefixed.use("/v1/chat/completions") == NO_MODEL  # not served without the prefix
    manager.close()


def test_a_stray_path_loads_nothing(serve) -> None:  # type: ignore[no-untyped-def]
    http = serve()
    assert http.get("/wp-admin").status_code == 404
    assert set(states(http).values()) == {"unloaded"}


def first_event(http: httpx.Client, model: str) -> dict:
    """The first event of the live view's feed for ``model``."""
    with http.stream("GET", "/v1/llamapy/events", params={"model": model}) as response:
        assert response.status_code == 200
        line = next(line for line in response.iter_lines() if line.startswith("data: "))
    return json.loads(line[6:])


def test_the_live_feed_watches_one_model_without_loading_it(serve) -> None:  # type: ignore[no-untyped-def]
    http = serve()
    idle = first_event(http, "two")
    assert (idle["model"], idle["state"], idle["slots"]) == ("two", "unloaded", [])
    assert {m["id"]: m["state"] for m in idle["models"]}["two"] == "unloaded"
    assert states(http)["two"] == "unloaded"  # watching loads nothing
    assert http.post("/v1/chat/completions", json=chat("two")).status_code == 200
    loaded = first_event(http, "two")
    assert loaded["model"] == "two" and len(loaded["slots"]) == 2
    assert loaded["tokens"]["generated"] > 0
    assert first_event(http, "uno")["state"] == "unloaded"  # an alias names its model
    assert http.get("/v1/llamapy/events", params={"model": "nope"}).status_code == 404


def test_under_an_api_prefix_the_requests_model_is_leased(serve) -> None:  # type: ignore[no-untyped-def]
    """``--api-prefix``: the routes' declared needs hold under the prefix (a model route
    leases, and loads, the request's model)."""
    http = serve(api_prefix="/llm")
    response = http.post("/llm/v1/chat/completions", json=chat("two"))
    assert response.status_code == 200, response.text
    assert states(http, "/llm")["two"] == "loaded" and states(http, "/llm")["one"] == "unloaded"
