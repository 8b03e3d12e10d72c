"""Stored responses and conversations on the fake app: ``store``, ``previous_response_id``,
``GET``/``DELETE /v1/responses/{id}``, ``input_items``, ``/v1/conversations``; tenants never
see each other's objects; a continuation costs what resending the conversation costs and
reuses its KV."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_http import ALIAS, FakeApp, keyed_app, submitted_options
from test_http_tenants import KEYS_FILE

from llamapy.openai_api.response_store import ResponseStore

BASE = {"model": ALIAS, "max_output_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def app() -> Iterator[FakeApp]:
    with keyed_app(KEYS_FILE) as served:
        yield served


def auth(key: str = "ka") -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def create(app: FakeApp, key: str = "ka", **body: Any) -> dict[str, Any]:
    r = app.send("POST", "/v1/responses", json={**BASE, **body}, headers=auth(key))
    assert r.status_code == 200, r.text
    return r.json()


def error(app: FakeApp, method: str, path: str, status: int, key: str = "ka",
          **kwargs: Any) -> dict[str, Any]:
    r = app.send(method, path, headers=auth(key), **kwargs)
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_a_stored_response_is_retrieved_and_deleted(app: FakeApp) -> None:
    first = create(app, input="hello there")
    assert first["store"] is True and first["previous_response_id"] is None
    got = app.send("GET", f"/v1/responses/{first['id']}", headers=auth()).json()
    assert got["id"] == first["id"] and got["output"] == first["output"]
    deleted = app.send("DELETE", f"/v1/responses/{first['id']}", headers=auth()).json()
    assert deleted == {"id": first["id"], "object": "response", "deleted": True}
    gone = error(app, "GET", f"/v1/responses/{first['id']}", 404)
    assert gone["code"] == "not_found" and gone["type"] == "invalid_request_error"
    error(app, "DELETE", f"/v1/responses/{first['id']}", 404)
    app.check_idle()


def test_store_false_keeps_nothing(app: FakeApp) -> None:
    first = create(app, input="hello", store=False)
    assert first["store"] is False
    error(app, "GET", f"/v1/responses/{first['id']}", 404)
    missing = error(app, "POST", "/v1/responses", 404,
                    json={**BASE, "input": "more", "previous_response_id": first["id"]})
    assert missing["code"] == "previous_response_not_found"
    assert missing["param"] == "previous_response_id"


def test_a_continuation_costs_what_resending_costs_and_reuses_the_kv(app: FakeApp) -> None:
    first = create(app, input="tell me about the tides", instructions="be brief")
    second = create(app, input="and the moon?", instructions="be brief",
                    previous_response_id=first["id"])
    assert second["previous_response_id"] == first["id"]
    whole = [{"role": "user", "content": "tell me about the tides"}, *first["output"],
             {"role": "user", "content": "and the moon?"}]
    resent = create(app, input=whole, instructions="be brief", store=False)
    assert second["usage"]["input_tokens"] == resent["usage"]["input_tokens"]
    cached = second["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached >= 0.8 * first["usage"]["input_tokens"]  # all but the re-rendered header
    counted = app.send("POST", "/v1/responses/input_tokens", headers=auth(), json={
        **BASE, "input": "and the moon?", "instructions": "be brief",
        "previous_response_id": first["id"]}).json()
    assert counted["input_tokens"] == second["usage"]["input_tokens"]
    app.check_idle()


def test_input_items_are_the_responses_own_a_page_at_a_time(app: FakeApp) -> None:
    first = create(app, input="one")
    items = [{"role": "user", "content": "two"}, {"type": "message", "role": "user",
                                                  "content": [{"type": "input_text",
                                                               "text": "three"}]}]
    second = create(app, input=items, previous_response_id=first["id"])
    path = f"/v1/responses/{second['id']}/input_items"
    listed = app.send("GET", path, headers=auth()).json()
    assert listed["object"] == "list" and listed["has_more"] is False
    texts = [item["content"][0]["text"] for item in listed["data"]]
    assert texts == ["three", "two"]  # newest first by default
    assert all(item["id"] and item["status"] == "completed" for item in listed["data"])
    page = app.send("GET", path, params={"order": "asc", "limit": 1}, headers=auth()).json()
    assert page["has_more"] is True and page["data"][0]["content"][0]["text"] == "two"
    rest = app.send("GET", path, params={"order": "asc", "after": page["last_id"]},
                    headers=auth()).json()
    assert [i["content"][0]["text"] for i in rest["data"]] == ["three"]
    for bad in ({"limit": 0}, {"limit": "x"}, {"order": "up"}, {"after": "nope"}):
        error(app, "GET", path, 400, params=bad)


def test_a_deleted_middle_keeps_the_chain_continuable(app: FakeApp) -> None:
    first = create(app, input="a")
    second = create(app, input="b", previous_response_id=first["id"])
    third = create(app, input="c", previous_response_id=second["id"])
    app.send("DELETE", f"/v1/responses/{second['id']}", headers=auth())
    error(app, "GET", f"/v1/responses/{second['id']}", 404)
    error(app, "POST", "/v1/responses", 404,
          json={**BASE, "input": "x", "previous_response_id": second["id"]})
    fourth = create(app, input="d", previous_response_id=third["id"])
    whole = [{"role": "user", "content": "a"}, *first["output"],
             {"role": "user", "content": "b"}, *second["output"],
             {"role": "user", "content": "c"}, *third["output"],
             {"role": "user", "content": "d"}]
    assert fourth["usage"]["input_tokens"] == create(app, input=whole, store=False)[
        "usage"]["input_tokens"]


def test_another_tenant_can_neither_read_continue_nor_delete(app: FakeApp) -> None:
    mine = create(app, key="ka", input="secret plans")
    for key in ("kb", "kdef", "kadm"):
        error(app, "GET", f"/v1/responses/{mine['id']}", 404, key=key)
        error(app, "GET", f"/v1/responses/{mine['id']}/input_items", 404, key=key)
        error(app, "DELETE", f"/v1/responses/{mine['id']}", 404, key=key)
        error(app, "POST", "/v1/responses", 404, key=key,
              json={**BASE, "input": "x", "previous_response_id": mine["id"]})
    conversation = app.send("POST", "/v1/conversations", headers=auth("ka"), json={}).json()
    error(app, "GET", f"/v1/conversations/{conversation['id']}", 404, key="kb")
    error(app, "POST", "/v1/responses", 404, key="kb",
          json={**BASE, "input": "x", "conversation": conversation["id"]})
    assert app.send("GET", f"/v1/responses/{mine['id']}", headers=auth("ka")).status_code == 200


def test_streamed_responses_are_stored_and_echo_their_state(app: FakeApp) -> None:
    first = create(app, input="hi")
    r = app.send("POST", "/v1/responses", headers=auth(), json={
        **BASE, "input": "more", "previous_response_id": first["id"], "stream": True})
    events = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
    responses = [e["response"] for e in events if "response" in e]
    assert responses and all(x["previous_response_id"] == first["id"] and x["store"]
                             for x in responses)
    final = responses[-1]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    got = app.send("GET", f"/v1/responses/{final['id']}", headers=auth()).json()
    assert got["output"] == final["output"]


def test_conversations_keep_items_and_responses_append_to_them(app: FakeApp) -> None:
    made = app.send("POST", "/v1/conversations", headers=auth(), json={
        "items": [{"role": "user", "content": "remember the number 7"}],
        "metadata": {"topic": "numbers"}}).json()
    cid = made["id"]
    assert made["object"] == "conversation" and made["metadata"] == {"topic": "numbers"}
    answer = create(app, input="which number?", conversation=cid)
    assert answer["conversation"] == {"id": cid}
    items = app.send("GET", f"/v1/conversations/{cid}/items", params={"order": "asc"},
                     headers=auth()).json()["data"]
    assert [i["type"] for i in items[:2]] == ["message", "message"]
    assert len(items) == 2 + len(answer["output"])
    added = app.send("POST", f"/v1/conversations/{cid}/items", headers=auth(),
                     json={"items": [{"role": "user", "content": "and 8"}]}).json()
    item_id = added["data"][0]["id"]
    got = app.send("GET", f"/v1/conversations/{cid}/items/{item_id}", headers=auth()).json()
    assert got["content"][0]["text"] == "and 8"
    after = app.send("DELETE", f"/v1/conversations/{cid}/items/{item_id}",
                     headers=auth()).json()
    assert after["id"] == cid and after["object"] == "conversation"
    error(app, "GET", f"/v1/conversations/{cid}/items/{item_id}", 404)
    updated = app.send("POST", f"/v1/conversations/{cid}", headers=auth(),
                       json={"metadata": {"topic": "more numbers"}}).json()
    assert updated["metadata"] == {"topic": "more numbers"}
    gone = app.send("DELETE", f"/v1/conversations/{cid}", headers=auth()).json()
    assert gone == {"id": cid, "object": "conversation.deleted", "deleted": True}
    error(app, "GET", f"/v1/conversations/{cid}", 404)


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("GET", "/v1/responses/" + "x" * 300, None, 404),
    ("GET", "/v1/responses/..%2F..%2Fetc", None, 404),
    ("GET", "/v1/responses/resp_1'%20OR%201=1--", None, 404),
    ("POST", "/v1/conversations", [1, 2], 400),
    ("POST", "/v1/conversations", {"metadata": {"k": 1}}, 400),
    ("POST", "/v1/conversations", {"metadata": {f"k{i}": "v" for i in range(17)}}, 400),
    ("POST", "/v1/conversations", {"items": [{"role": "user", "content": "x"}] * 21}, 400),
    ("POST", "/v1/conversations", {"items": [{"type": "bogus"}]}, 400),
    ("POST", "/v1/conversations", {"items": "not a list"}, 400),
    ("POST", "/v1/responses", {**BASE, "input": "x", "previous_response_id": 5}, 404),
    ("POST", "/v1/responses", {**BASE, "input": "x", "conversation": 5}, 400),
    ("POST", "/v1/responses", {**BASE, "input": "x", "conversation": "c",
                               "previous_response_id": "r"}, 400),
])
def test_hostile_ids_and_bodies_get_a_typed_4xx(app: FakeApp, method: str, path: str,
                                                body: Any, status: int) -> None:
    kwargs = {} if body is None else {"json": body}
    assert error(app, method, path, status, **kwargs)["message"]


def test_with_the_store_off_the_state_is_refused() -> None:
    with FakeApp(app_options={"responses_store": "off"}) as app:
        r = app.send("POST", "/v1/responses", json={**BASE, "input": "x",
                                                     "previous_response_id": "resp_1"})
        assert r.status_code == 400 and "previous_response_id" in r.text
        assert app.send("GET", "/v1/responses/resp_1").status_code == 501


# --- the store itself: retention ----------------------------------------------------------------

def response(rid: str, text: str) -> dict[str, Any]:
    return {"id": rid, "status": "completed",
            "output": [{"type": "message", "id": f"m{rid}", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}]}]}


def test_expired_responses_are_gone_but_a_live_chain_keeps_its_links() -> None:
    clock = [1000.0]
    store = ResponseStore(":memory:", ttl_s=100, now=lambda: clock[0])
    store.put_response("t", response("r1", "a"), [], None)
    clock[0] += 60
    store.put_response("t", response("r2", "b"), [], "r1")
    clock[0] += 60  # r1 expired, r2 not
    assert store.get_response("t", "r1") is None
    history = store.history("t", "r2")
    assert [i["content"][0]["text"] for i in history or []] == ["a", "b"]
    clock[0] += 100
    store.put_response("t", response("r3", "c"), [], None)  # sweeps: both chain links go
    assert store._rows("SELECT id FROM responses") == [("r3",)]


def test_over_its_bytes_the_least_recently_used_leaf_goes_first() -> None:
    store = ResponseStore(":memory:", max_bytes=1200)
    for i in range(6):
        store.put_response("t", response(f"r{i}", "x" * 100), [], f"r{i - 1}" if i else None)
    store.put_response("u", response("other", "y" * 100), [], None)
    kept = {row[0] for row in store._rows("SELECT id FROM responses")}
    assert "r5" in kept or "other" in kept
    assert store._bytes() <= 1200
    for rid in kept - {"other"}:  # a kept response's chain is whole
        assert store.history("t", rid) is not None


def test_compaction_of_a_stored_conversation_by_its_id(app: FakeApp) -> None:
    first = create(app, input="the plan is to rewrite the parser")
    second = create(app, input="and then the lexer", previous_response_id=first["id"])
    r = app.send("POST", "/v1/responses/compact", headers=auth(), json={
        "model": ALIAS, "previous_response_id": second["id"]})
    assert r.status_code == 200, r.text
    output = r.json()["output"]
    users = [item["content"][0]["text"] for item in output if item["type"] == "message"]
    assert users == ["the plan is to rewrite the parser", "and then the lexer"]
    assert output[-1]["type"] == "compaction"
    error(app, "POST", "/v1/responses/compact", 404, key="kb",
          json={"model": ALIAS, "previous_response_id": second["id"]})


def test_a_chain_keeps_its_slot_affinity(app: FakeApp) -> None:
    first = create(app, input="start")
    with submitted_options(app) as seen:
        second = create(app, input="go on", previous_response_id=first["id"])
        create(app, input="and on", previous_response_id=second["id"])
        own_key = create(app, input="x", previous_response_id=second["id"],
                         prompt_cache_key="mine")
    sessions = [options.session for options in seen]
    assert sessions[0] == sessions[1] == first["id"] and sessions[2] == "mine"
    assert not any(options.cache_pins for options in seen)  # (a pin copies the KV: no default)
    assert own_key["previous_response_id"] == second["id"]


def test_stored_state_survives_a_restart(tmp_path: Path) -> None:
    options = {"responses_store": str(tmp_path / "responses.sqlite3")}
    with FakeApp(app_options=options) as app:
        first = app.send("POST", "/v1/responses", json={**BASE, "input": "remember me"}).json()
        cid = app.send("POST", "/v1/conversations", json={"metadata": {"a": "b"}}).json()["id"]
    with FakeApp(app_options=options) as app:
        assert app.send("GET", f"/v1/responses/{first['id']}").json()["output"] == first["output"]
        more = app.send("POST", "/v1/responses", json={
            **BASE, "input": "again", "previous_response_id": first["id"]})
        assert more.status_code == 200 and more.json()["previous_response_id"] == first["id"]
        assert app.send("GET", f"/v1/conversations/{cid}").json()["metadata"] == {"a": "b"}
    assert (tmp_path / "responses.sqlite3").stat().st_mode & 0o777 == 0o600


def test_a_conversations_turns_share_the_tag_a_router_can_read() -> None:
    from llamapy.openai_api.response_ids import conversation_tag
    from llamapy.ray.keys import routing_key

    with FakeApp(app_options={"responses_store": ":memory:"}) as app:
        body = {**BASE, "input": "plan the refactor", "instructions": "be brief"}
        first = app.send("POST", "/v1/responses", json=body).json()
        second = app.send("POST", "/v1/responses", json={
            **BASE, "input": "next", "previous_response_id": first["id"]}).json()
        third = app.send("POST", "/v1/responses", json={
            **BASE, "input": "then", "previous_response_id": second["id"]}).json()
        other = app.send("POST", "/v1/responses", json={**BASE, "input": "else"}).json()
    tags = {r["id"][5:13] for r in (first, second, third)}
    assert tags == {conversation_tag(body)} and other["id"][5:13] not in tags
    assert second["previous_response_id"] == first["id"]
    # a router sees the same session for the first turn and its continuations
    key = lambda b: routing_key({}, b, path="/v1/responses").session  # noqa: E731
    assert key(body) == key({"input": "then", "previous_response_id": second["id"]})
    assert key(body) != key({"input": "else"})
    assert key({**body, "prompt_cache_key": "mine"}) != key(body)  # the client's key first
    assert routing_key({}, body, path="/v1/chat/completions").session is None


def test_a_tenant_filling_the_store_evicts_its_own_first() -> None:
    store = ResponseStore(":memory:", max_bytes=6000, tenant_max_bytes=2000)
    store.put_response("quiet", response("q1", "x" * 200), [], None)
    for i in range(40):
        store.put_response("noisy", response(f"n{i}", "y" * 200), [], None)
    cid = "conv_1"
    store.create_conversation("noisy", cid, {}, [])
    store.add_items("noisy", cid, [{"id": f"i{i}", "text": "z" * 300} for i in range(10)])
    assert store.get_response("quiet", "q1") is not None  # untouched by the other's flood
    assert store._bytes("noisy") <= 2000 and store._bytes() <= 6000
    assert store.get_response("noisy", "n39") is None or store.items("noisy", cid) is None


DEEP = "[" * 1000 + "]" * 1000  # (JSON parsers take it; Python's encoder recurses on it)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/responses", '{"model": "fake", "input": [{"role": "user", "content": "x", '
                      '"junk": %s}]}', "input"),
    ("/v1/conversations", '{"items": [{"role": "user", "content": "x", "junk": %s}]}',
     "items"),
])
def test_an_item_nested_too_deeply_to_store_is_a_400_before_anything_runs(
        app: FakeApp, path: str, body: str, param: str) -> None:
    r = app.send("POST", path, content=body % DEEP,
                 headers={**auth(), "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    app.check_idle()


def test_an_unstored_deep_item_still_runs(app: FakeApp) -> None:
    body = ('{"model": "fake", "max_output_tokens": 2, "store": false, "input": [{"role": '
            '"user", "content": "x", "junk": ' + DEEP + '}]}')
    r = app.send("POST", "/v1/responses", content=body,
                 headers={**auth(), "content-type": "application/json"})
    assert r.status_code == 200, r.text
