"""``/v1/embeddings`` and ``/embeddings`` read ``input`` as llama-server does: token ids and
strings mixed in one input, lists of inputs of any shape, ``prompt_string`` objects."""

from __future__ import annotations

import httpx
import pytest

MIXED_CASES = [
    ("string", 1), ([12, 34, 56], 1), ([12, 34, "string", 56, 78], 1),
    (["string1", "string2"], 2), (["string1", [12, 34, 56]], 2),
    ([[12, 34, 56], [12, 34, 56]], 2), ([[12, 34, 56], [12, "string", 34, 56]], 2),
    ({"prompt_string": "string"}, 1), ({"content": [{"type": "text", "text": "string"}]}, 1),
    (["string1", {"prompt_string": "string2"},
      {"content": [{"type": "text", "text": "string3"}]}], 3),
]


def vectors(http: httpx.Client, value: object, path: str = "/v1/embeddings") -> list[list[float]]:
    r = http.post(path, json={"input": value})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [d["index"] for d in data] == list(range(len(data)))
    return [d["embedding"] for d in data]


@pytest.mark.parametrize(("value", "count"), MIXED_CASES)
def test_every_input_shape_llama_server_takes(http: httpx.Client, value: object,
                                              count: int) -> None:
    got = vectors(http, value)
    assert len(got) == count and all(len(v) > 1 for v in got)


def test_a_mixed_list_is_its_parts_tokenized_in_place(http: httpx.Client) -> None:
    ids = http.post("/tokenize", json={"content": " tax law"}).json()["tokens"]
    head = http.post("/tokenize", json={"content": "a red apple", "add_special": True}
                     ).json()["tokens"]
    mixed, whole = vectors(http, ["a red apple", *ids]), vectors(http, [*head, *ids])
    assert mixed[0] == pytest.approx(whole[0], abs=1e-5)
    by_object = vectors(http, [{"prompt_string": [*head, " tax law"]}])
    assert by_object[0] == pytest.approx(whole[0], abs=1e-4)


def test_native_embeddings_answer_in_llama_servers_shape(http: httpx.Client) -> None:
    """``/embeddings`` (llama-server's own route): a list of ``{"index", "embedding":
    [vector]}``, the same vectors as ``/v1/embeddings``."""
    native = http.post("/embeddings", json={"content": ["a red apple", "tax law"]})
    assert native.status_code == 200, native.text
    body = native.json()
    assert [item["index"] for item in body] == [0, 1]
    assert [len(item["embedding"]) for item in body] == [1, 1]
    oai = vectors(http, ["a red apple", "tax law"])
    assert body[1]["embedding"][0] == pytest.approx(oai[1], abs=1e-5)


@pytest.mark.parametrize("value", ["", [], [[]], [True], [1.5], [{"prompt_string": {}}],
                                   [10**9, "x"], {"content": "string"}, ["a", {"content": "b"}]])
def test_empty_and_malformed_inputs_are_400s(http: httpx.Client, value: object) -> None:
    r = http.post("/v1/embeddings", json={"input": value})
    assert r.status_code == 400, r.text
