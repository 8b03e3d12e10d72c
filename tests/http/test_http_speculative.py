"""Speculative decoding over HTTP: per-request settings (ours and llama-server's), timings,
``/metrics``, ``/slots``, the flags, and bad values as 400s."""

from __future__ import annotations

import httpx
import pytest
from http_helpers import MODEL_ALIAS

from llamapy.options import resolve_start_options
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.start import start_options

CODE = ("def area(width, height):\n    return width * height\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n")
COPY = f"Copy this code exactly:\n\n{CODE}"


def chat_body(**extra: object) -> dict[str, object]:
    return {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": COPY}],
            "max_tokens": 64, "temperature": 0, **extra}


def test_request_turns_speculation_on_and_reports_drafts(http: httpx.Client) -> None:
    plain = http.post("/v1/chat/completions", json=chat_body())
    assert plain.status_code == 200, plain.text
    assert "draft_n" not in plain.json()["timings"]  # the shared server's default is off
    drafted = http.post("/v1/chat/completions",
                        json=chat_body(speculative={"type": "ngram", "adaptive": False}))
    assert drafted.status_code == 200, drafted.text
    timings = drafted.json()["timings"]
    assert timings["draft_n"] > 0
    assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    metrics = http.get("/metrics").text
    assert "llamacpp:spec_decode_num_draft_tokens_total" in metrics
    assert "llamapy_draft_accepted_per_pos_total{position=\"0\"}" in metrics
    counted = [line for line in metrics.splitlines()
               if line.startswith("llamacpp:spec_decode_num_accepted_tokens_total ")]
    assert float(counted[0].split()[1]) >= timings["draft_n_accepted"]


def test_llama_server_flat_speculative_fields(http: httpx.Client) -> None:
    body = {"prompt": COPY, "n_predict": 48, "temperature": 0,
            "speculative.type": "ngram-mod", "speculative.n_max": 2}
    done = http.post("/completion", json=body)
    assert done.status_code == 200, done.text
    timings = done.json()["timings"]
    assert timings["draft_n"] > 0
    # every verification drafts at most n_max=2 tokens, and there is one per accepted run
    assert timings["draft_n"] <= 2 * done.json()["tokens_predicted"]


@pytest.mark.parametrize("value", ["warp", {"n_max": -1}, {"n_maximum": 4}, 7])
def test_bad_speculative_values_are_400(http: httpx.Client, value: object) -> None:
    bad = http.post("/v1/chat/completions", json=chat_body(speculative=value))
    assert bad.status_code == 400, bad.text
    error = bad.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "speculative" in error["message"]


def test_slots_say_whether_the_server_speculates(http: httpx.Client) -> None:
    assert all(slot["speculative"] is False for slot in http.get("/slots").json())


def test_llama_server_spec_flags_parse() -> None:
    args = build_parser().parse_args(["-m", "x.gguf", "--spec-type", "ngram-mod,draft-simple",
                                      "--spec-draft-n-max", "8", "--draft-min", "2",
                                      "-md", "draft.gguf"])
    start = resolve_start_options("x.gguf", start_options(args))
    assert start.engine.speculative.type == ("ngram", "draft")
    assert (start.engine.speculative.n_max, start.engine.speculative.n_min) == (8, 2)
    assert start.server.spec_draft_model == "draft.gguf"
    implied = build_parser().parse_args(["-m", "x.gguf", "--model-draft", "d.gguf"])
    assert resolve_start_options("x.gguf", start_options(implied)).engine.speculative.type \
        == ("draft",)
