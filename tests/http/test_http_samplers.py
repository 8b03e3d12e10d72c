"""llama-server's ``samplers`` field and the penalty samplers on the real model."""

from __future__ import annotations

import httpx
import pytest

PROMPT = "Write a list of random words:"


def texts(http: httpx.Client, path: str, seeds: range, **fields) -> set[str]:
    out = set()
    for seed in seeds:
        if path == "/completion":
            body = {"prompt": PROMPT, "n_predict": 12, "seed": seed, "cache_prompt": False,
                    **fields}
            done = http.post(path, json=body)
            assert done.status_code == 200, done.text
            out.add(done.json()["content"])
        else:
            body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12,
                    "seed": seed, "cache_prompt": False, **fields}  # (alike prompt batches)
            done = http.post(path, json=body)
            assert done.status_code == 200, done.text
            out.add(done.json()["choices"][0]["message"]["content"])
    return out


@pytest.mark.parametrize("path", ["/completion", "/v1/chat/completions"])
def test_a_sampler_left_out_of_samplers_is_not_applied(http: httpx.Client, path: str) -> None:
    hot = {"top_k": 1, "temperature": 2.0, "top_p": 1.0, "min_p": 0.0}
    assert len(texts(http, path, range(3), **hot)) == 1  # top_k=1 decides
    assert len(texts(http, path, range(3), samplers="kt", **hot)) == 1
    assert len(texts(http, path, range(3), samplers=["temperature"], **hot)) > 1


def test_samplers_are_reported_and_bad_names_are_a_400(http: httpx.Client) -> None:
    done = http.post("/completion", json={"prompt": PROMPT, "n_predict": 2,
                                          "samplers": ["top_k", "temp"]}).json()
    assert done["generation_settings"]["samplers"] == ["top_k", "temperature"]
    params = http.get("/props").json()["default_generation_settings"]["params"]
    assert params["samplers"][0] == "penalties" and params["samplers"][-1] == "temperature"
    bad = http.post("/completion", json={"prompt": PROMPT, "samplers": ["top_k", "nope"]})
    assert bad.status_code == 400 and "nope" in bad.text


@pytest.mark.parametrize("field", [{"repeat_penalty": 1.3}, {"presence_penalty": 0.8},
                                   {"frequency_penalty": 0.8}])
def test_penalties_run(http: httpx.Client, field: dict) -> None:
    base = {"prompt": "Repeat after me: go go go go go go", "n_predict": 16, "temperature": 0}
    plain = http.post("/completion", json=base).json()["content"]
    penalised = http.post("/completion", json={**base, **field})
    assert penalised.status_code == 200, penalised.text
    assert penalised.json()["content"] != plain


@pytest.mark.parametrize("field", [
    {"dry_multiplier": 0.8}, {"xtc_probability": 0.5, "xtc_threshold": 0.1},
    {"mirostat": 1}, {"mirostat": 2}, {"top_n_sigma": 1.0}, {"typical_p": 0.8},
    {"dynatemp_range": 0.5}, {"min_p": 0.2, "top_p": 0.5, "top_k": 5}])
def test_every_sampler_generates(http: httpx.Client, field: dict) -> None:
    done = http.post("/completion", json={"prompt": PROMPT, "n_predict": 8, "seed": 3,
                                          "temperature": 0.9, "ignore_eos": True, **field})
    assert done.status_code == 200, done.text
    assert done.json()["tokens_predicted"] == 8
