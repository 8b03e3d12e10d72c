"""``min_keep`` (llama-server's request field): top_p, min_p, typical and XTC keep at least that
many tokens. Added as one option of the option tree and its use in the sampler chain; these
tests show it reaching every edge: the Python call, the OpenAI body, llama-server's
``/completion``, ``/props`` and the typed refusal of a bad value."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from llamapy.errors import InvalidOptionError
from llamapy.serve import create_app
from llamapy.server import Server

PROMPT = "The best way to spend a rainy afternoon is"
#: top_p this small keeps only the most likely token, unless min_keep keeps more; the
#: temperature makes any kept runner-up likely to be drawn somewhere in 12 tokens.
NARROW = {"top_p": 0.01, "temp": 3.0, "max_tokens": 12, "min_p": 0.0}
SEEDS = range(1, 7)


def texts(server: Server, **options: object) -> set[str]:
    return {server.generate(PROMPT, seed=seed, timeout=120, **{**NARROW, **options})
            for seed in SEEDS}


def test_min_keep_widens_what_the_truncating_samplers_leave(server: Server) -> None:
    assert len(texts(server)) == 1  # one token per step survives top_p: the seed cannot matter
    assert len(texts(server, min_keep=20)) > 1  # 20 survive: the hot temperature spreads them


def test_a_bad_min_keep_is_refused_before_anything_runs(server: Server) -> None:
    for bad in (-1, 2**31, 1.5, "3", True):
        with pytest.raises(InvalidOptionError, match="min_keep"):
            server.generate(PROMPT, min_keep=bad, max_tokens=1)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[TestClient]:
    with TestClient(create_app(server, alias="smol"), base_url="http://localhost") as client:
        yield client


def test_min_keep_over_http(http: TestClient) -> None:
    chat = {"messages": [{"role": "user", "content": PROMPT}], "top_p": 0.01,
            "temperature": 2.0, "min_p": 0.0, "max_tokens": 12}
    narrow = {http.post("/v1/chat/completions", json={**chat, "seed": s}).json()
              ["choices"][0]["message"]["content"] for s in SEEDS}
    wide = {http.post("/v1/chat/completions", json={**chat, "seed": s, "min_keep": 20}).json()
            ["choices"][0]["message"]["content"] for s in SEEDS}
    assert len(narrow) == 1 and len(wide) > 1
    done = http.post("/completion", json={"prompt": PROMPT, "n_predict": 2, "min_keep": 5})
    assert done.status_code == 200 and done.json()["generation_settings"]["min_keep"] == 5
    assert http.get("/props").json()["default_generation_settings"]["params"]["min_keep"] == 0
    refused = http.post("/v1/chat/completions", json={**chat, "min_keep": -3})
    assert refused.status_code == 400 and "min_keep" in refused.json()["error"]["message"]
