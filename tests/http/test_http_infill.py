"""llama-server's ``/infill``: its FIM prompt layout, its errors, and (with FIM tokens given to
the test model, which has none) the whole route on the real model."""

from __future__ import annotations

import httpx
import pytest

from llamapy._native import Model
from llamapy.errors import EndpointDisabledError, InvalidOptionError
from llamapy.openai_api.infill import CHUNK_SEPARATOR, check_infill, infill_tokens

FIM = {"pre": 1001, "suf": 1002, "mid": 1003, "pad": -1, "rep": 1004, "sep": 1005}
NO_REPO = {**FIM, "rep": -1, "sep": -1}


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_the_model_without_fim_tokens_answers_501(http: httpx.Client) -> None:
    bad = http.post("/infill", json={"input_prefix": "def f(", "input_suffix": ")"})
    assert bad.status_code == 501, bad.text
    assert bad.json()["error"]["message"] == (
        "Infill is not supported by this model: prefix token is missing. suffix token is "
        "missing. middle token is missing. ")


def test_the_repo_level_layout() -> None:
    request = {"input_prefix": "ab", "input_suffix": "cd", "prompt": "p",
               "input_extra": [{"filename": "x.py", "text": "X"}]}
    ids = infill_tokens(FIM, chars, request, n_batch=64, n_predict=4, n_ctx=512, bos=7)
    extra = [1004, *chars("myproject\n"), 1005, *chars("x.py\n"), *chars("X"),
             1005, *chars("filename\n")]
    assert ids == [*extra, 7, 1001, *chars("abp"), 1002, *chars("cd"), 1003]
    spm = infill_tokens(FIM, chars, request, n_batch=64, n_predict=4, n_ctx=512, spm=True)
    assert spm == [*extra, 1002, *chars("cd"), 1001, *chars("abp"), 1003]


def test_without_file_tokens_chunks_are_separated_in_text() -> None:
    request = {"input_prefix": "a", "input_suffix": "b",
               "input_extra": [{"text": "one"}, {"text": "two"}]}
    ids = infill_tokens(NO_REPO, chars, request, n_batch=64, n_predict=0, n_ctx=512)
    assert ids == [*chars(CHUNK_SEPARATOR + "one" + CHUNK_SEPARATOR + "two"),
                   1001, *chars("a"), 1002, *chars("b"), 1003]


def test_prefix_suffix_and_extra_are_cut_to_fit() -> None:
    request = {"input_prefix": "p" * 100, "input_suffix": "s" * 100,
               "input_extra": [{"text": "e" * 100}]}
    ids = infill_tokens(NO_REPO, chars, request, n_batch=40, n_predict=5, n_ctx=100)
    assert ids.count(ord("p")) == 30  # the last 3/4 n_batch of the prefix
    assert ids.count(ord("s")) == 8  # n_batch/4 minus 2
    assert ids.count(ord("e")) == 100 - 40 - 2 * 5  # the newest n_ctx - n_batch - 2 n_predict
    assert ids[-1] == 1003


@pytest.mark.parametrize(("body", "says"), [
    ({"input_suffix": ""}, "input_prefix"), ({"input_prefix": ""}, "input_suffix"),
    ({"input_prefix": "", "input_suffix": "", "prompt": 3}, "prompt"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "x"}]},
     "input_extra"),
])
def test_malformed_bodies_are_400(body: dict, says: str) -> None:
    with pytest.raises(InvalidOptionError, match=says):
        check_infill(FIM, body)
    with pytest.raises(EndpointDisabledError):
        check_infill({}, body)


def test_infill_runs_on_the_real_model(http: httpx.Client, monkeypatch: pytest.MonkeyPatch
                                       ) -> None:
    # SmolLM2 has no FIM tokens: stand plain tokens in for them to drive the whole route
    monkeypatch.setattr(Model, "fim_tokens", property(lambda self: {**NO_REPO, "pre": 28,
                                                                    "suf": 29, "mid": 30}))
    body = {"input_prefix": "def add(a, b):\n    return a", "input_suffix": "\n",
            "n_predict": 4, "temperature": 0}
    done = http.post("/infill", json=body)
    assert done.status_code == 200, done.text
    result = done.json()
    assert result["tokens_predicted"] >= 1 and result["stop"] is True
    assert result["tokens_evaluated"] >= 5
    streamed = http.post("/infill", json={**body, "stream": True})
    assert streamed.status_code == 200 and "data: " in streamed.text
