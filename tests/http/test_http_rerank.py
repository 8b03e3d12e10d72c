"""``/rerank`` on a real reranker: the tiny BERT of ``llamapy.testing.tiny_reranker_path``
(2 layers, a classifier head, rank pooling), served as ``--reranking`` serves it.

Its weights are arbitrary (integer hashing, the same bytes on every machine), so these tests
prove the plumbing and llama-server's contract (shapes, ordering by score, ``top_n``, usage,
errors, scores independent of batching and order), never that a relevant document scores
higher: that needs trained weights, which no package ships.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from llamapy._native import Model
from llamapy._paths import sha256_file
from llamapy.embeddings import RANK, Embedder, rerank_tokens
from llamapy.serve import create_app
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.compat import check_compat
from llamapy.serve.flags.start import serve_start_options
from llamapy.server import Server
from llamapy.testing import TINY_RERANKER_SHA256, tiny_reranker_path, write_tiny_reranker

QUERY = "machine learning is"
DOCS = ["a machine is a system", "learning is a process",
        "machine learning is a field of study", "paris is a city of art"]


@pytest.fixture(scope="module")
def reranker() -> Iterator[TestClient]:
    server = Server(tiny_reranker_path(), n_ctx=512, n_parallel=1, pooling_type=RANK)
    server.wait_ready(60)
    with TestClient(create_app(server, alias="rr", own_server=True),
                    base_url="http://localhost") as client:
        yield client


def test_the_tiny_reranker_is_the_same_bytes_everywhere(tmp_path_factory: pytest.TempPathFactory
                                                        ) -> None:
    again = write_tiny_reranker(tmp_path_factory.mktemp("rr") / "again.gguf")
    assert sha256_file(again) == sha256_file(tiny_reranker_path()) == TINY_RERANKER_SHA256


def test_documents_come_back_best_first_with_their_usage(reranker: TestClient) -> None:
    answer = reranker.post("/rerank", json={"query": QUERY, "documents": DOCS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == "rr" and body["object"] == "list"
    scores = [r["relevance_score"] for r in body["results"]]
    assert sorted(r["index"] for r in body["results"]) == [0, 1, 2, 3]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == 4
    model = Model(tiny_reranker_path())
    # llama-server's pair: [CLS] query [SEP] [SEP] document [SEP] for a BERT vocabulary
    pair = [model.bos, *model.tokenize(QUERY, False, False), model.eos, model.sep,
            *model.tokenize(DOCS[0], False, False), model.eos]
    assert rerank_tokens(model, QUERY, DOCS[0]) == pair
    n_tokens = sum(len(rerank_tokens(model, QUERY, doc)) for doc in DOCS)
    assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}


def test_scores_do_not_depend_on_batching_or_order(reranker: TestClient) -> None:
    together = reranker.post("/v1/rerank", json={"query": QUERY, "documents": DOCS}).json()
    by_index = {r["index"]: r["relevance_score"] for r in together["results"]}
    reversed_ = reranker.post("/reranking", json={"query": QUERY, "documents": DOCS[::-1]})
    for result in reversed_.json()["results"]:
        assert result["relevance_score"] == pytest.approx(
            by_index[len(DOCS) - 1 - result["index"]], abs=1e-5)
    model = Model(tiny_reranker_path())
    with Embedder(model, n_ctx=512, pooling=RANK) as embedder:
        for i, doc in enumerate(DOCS):  # each pair alone, in a decode of its own
            alone = embedder.score_tokens([rerank_tokens(model, QUERY, doc)])[0]
            assert alone == pytest.approx(by_index[i], abs=1e-5)


@pytest.mark.parametrize(("top_n", "expected"), [(None, 4), (2, 2), (4, 4), (99, 4), (0, 0)])
def test_top_n_keeps_the_best(reranker: TestClient, top_n: int | None, expected: int) -> None:
    body = {"query": QUERY, "documents": DOCS}
    if top_n is not None:
        body["top_n"] = top_n
    results = reranker.post("/rerank", json=body).json()["results"]
    best = reranker.post("/rerank", json={"query": QUERY, "documents": DOCS}).json()["results"]
    assert results == best[:expected]


def test_tei_and_document_objects(reranker: TestClient) -> None:
    tei = reranker.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})
    assert tei.status_code == 200 and isinstance(tei.json(), list)
    assert all(DOCS[r["index"]] == r["text"] and "score" in r for r in tei.json())
    jina = reranker.post("/v1/rerank", json={"query": QUERY, "top_n": 1,
                                             "documents": [{"text": d} for d in DOCS],
                                             "return_documents": True}).json()["results"]
    assert jina[0]["index"] == tei.json()[0]["index"]
    assert jina[0]["document"] == {"text": DOCS[jina[0]["index"]]}


@pytest.mark.parametrize("body", [
    {"query": QUERY, "documents": []}, {"query": QUERY, "documents": None},
    {"query": QUERY, "documents": 123}, {"query": QUERY, "documents": [1, 2, 3]},
    {"documents": DOCS}, {"query": 5, "documents": DOCS}, {"query": QUERY},
    {"query": QUERY, "documents": DOCS, "texts": DOCS},
    {"query": QUERY, "documents": DOCS, "top_n": -1},
    {"query": QUERY, "documents": DOCS, "top_n": True},
    {"query": QUERY, "documents": DOCS, "top_n": "2"},
    {"query": QUERY, "documents": DOCS, "return_documents": "yes"},
    {"query": QUERY, "documents": DOCS, "rank_fields": ["x"]},
    {"query": QUERY, "documents": DOCS, "model": "another"},
    ["not", "an", "object"],
])
def test_bad_requests_are_refused_in_shape(reranker: TestClient, body: object) -> None:
    answer = reranker.post("/rerank", json=body)
    assert answer.status_code in (400, 404), answer.text
    assert "error" in answer.json()


def test_a_server_without_reranking_answers_501(http: object) -> None:
    answer = http.post("/rerank", json={"query": QUERY, "documents": DOCS})  # type: ignore[attr-defined]
    assert answer.status_code == 501
    assert "--reranking" in answer.json()["error"]["message"]


def test_the_flag_sets_rank_pooling_and_refuses_another() -> None:
    parser = build_parser()
    for flag in ("--reranking", "--rerank"):
        args = parser.parse_args([flag])
        check_compat(args)
        assert serve_start_options(args)["pooling_type"] == RANK
    with pytest.raises(Exception, match="pooling rank"):
        check_compat(parser.parse_args(["--reranking", "--pooling", "mean"]))


def test_a_pair_past_the_models_positions_is_a_400_and_the_server_lives_on(
        reranker: TestClient) -> None:
    # BERT's positions are learned: 512 here. Decoding past them aborts llama.cpp, so the
    # embedder refuses such an input (embeddings alike) before any decode.
    for path, body in (("/rerank", {"query": QUERY, "documents": ["a " * 700]}),
                       ("/v1/embeddings", {"input": "a " * 700})):
        answer = reranker.post(path, json=body)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["type"] == "exceed_context_size_error"
    fits = reranker.post("/rerank", json={"query": QUERY, "documents": ["a " * 490]})
    assert fits.status_code == 200, fits.text


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ("/completion", {"prompt": "hi", "n_predict": 2}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/api/generate", {"model": "rr", "prompt": "hi", "stream": False}),
])
def test_a_ranking_server_refuses_to_generate(reranker: TestClient, path: str,
                                              body: dict[str, object]) -> None:
    answer = reranker.post(path, json=body)
    assert answer.status_code == 501, answer.text
    assert "/rerank" in answer.text


def test_the_work_of_one_request_is_bounded(reranker: TestClient) -> None:
    # max_embedding_tokens (65536 by default) bounds all inputs together, for rerank and
    # embeddings alike: 2000 pairs of ~45 tokens is ~90k tokens
    many = ["machine learning is a field of study " * 5] * 2000
    for path, body in (("/rerank", {"query": QUERY, "documents": many}),
                       ("/v1/embeddings", {"input": many})):
        answer = reranker.post(path, json=body)
        assert answer.status_code == 400, answer.text[:200]
        assert "tokens (all inputs together)" in answer.json()["error"]["message"]


NASTY = ("", "\x00", "\u202e\ufeff", "[CLS] [SEP] [MASK]", "{query}", "x" * 5000, "é" * 3000,
         2**63, -1, 1.5, None, True, {"text": 5}, {"text": ["a"]}, [[["deep"]]], {})


@pytest.mark.parametrize("value", NASTY, ids=repr)
def test_hostile_values_get_a_typed_answer_and_the_server_lives_on(reranker: TestClient,
                                                                   value: object) -> None:
    for body in ({"query": value, "documents": DOCS}, {"query": QUERY, "documents": [value]},
                 {"query": QUERY, "documents": DOCS, "top_n": value},
                 {"query": QUERY, "texts": [value, "a"], "return_text": value}):
        answer = reranker.post("/rerank", json=body)
        assert answer.status_code < 500, (body, answer.text[:200])
    assert reranker.post("/rerank", json={"query": QUERY, "documents": DOCS}).status_code == 200


def test_the_model_fetcher_writes_the_tiny_reranker(capsys: pytest.CaptureFixture[str]) -> None:
    from llamapy.models import main

    assert main(["fetch", "--reranker"]) == 0
    assert capsys.readouterr().out.strip() == str(tiny_reranker_path())


def test_teis_truncate_and_raw_scores(reranker: TestClient) -> None:
    tei = {"query": QUERY, "texts": DOCS, "raw_scores": False, "truncate": False}
    plain = reranker.post("/rerank", json=tei)
    assert plain.status_code == 200, plain.text
    long = ["a machine " * 400, DOCS[1]]  # ~800 tokens: past the 512 positions
    refused = reranker.post("/rerank", json={"query": QUERY, "texts": long})
    assert refused.status_code == 400
    for direction in ("Right", "Left"):
        cut = reranker.post("/rerank", json={"query": QUERY, "texts": long, "truncate": True,
                                             "truncation_direction": direction})
        assert cut.status_code == 200, cut.text
        assert sorted(r["index"] for r in cut.json()) == [0, 1]
    bad = reranker.post("/rerank", json={**tei, "truncation_direction": "Middle"})
    assert bad.status_code == 400
