"""llama-server's value spellings: ``-ngl auto|all``, ``-fa enabled|disabled|...`` and
``--api-key`` with several comma-separated keys."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from http_helpers import MODEL_ALIAS
from live import LiveApp

from llamapy._native.context import _FLASH, _enum
from llamapy.errors import InvalidOptionError
from llamapy.options import ModelOptions, resolve_start_options
from llamapy.serve import create_app
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.serving import app_options
from llamapy.serve.flags.start import serve_start_options, start_options
from llamapy.server import Server


def parsed(*argv: str):
    return resolve_start_options("x.gguf", start_options(build_parser().parse_args(list(argv))))


@pytest.mark.parametrize(("value", "layers"), [("auto", -1), ("all", -1), ("12", 12),
                                               ("-1", -1), ("0", 0)])
def test_gpu_layers_take_llama_servers_words(value: str, layers: int) -> None:
    assert parsed("-ngl", value).model.n_gpu_layers == layers


def test_gpu_layers_refuse_other_words() -> None:
    with pytest.raises(InvalidOptionError, match="n_gpu_layers"):
        ModelOptions(n_gpu_layers="most")


@pytest.mark.parametrize(("value", "native"), [
    ("on", 1), ("enabled", 1), ("true", 1), ("1", 1), ("off", 0), ("disabled", 0),
    ("false", 0), ("0", 0), ("auto", -1), ("-1", -1)])
def test_flash_attn_takes_llama_servers_words(value: str, native: int) -> None:
    assert _enum(_FLASH, parsed("-fa", value).context.flash_attn, "flash_attn") == native


def test_flash_attn_refuses_other_words() -> None:
    with pytest.raises(InvalidOptionError, match="flash_attn"):
        _enum(_FLASH, "sometimes", "flash_attn")


@pytest.fixture(scope="module")
def two_keys(server: Server) -> Iterator[LiveApp]:
    with LiveApp(create_app(server, alias=MODEL_ALIAS, api_key="first, second")) as app:
        yield app


@pytest.mark.parametrize(("headers", "status"), [
    ({"Authorization": "Bearer first"}, 200), ({"Authorization": "Bearer second"}, 200),
    ({"x-api-key": "second"}, 200), ({"Authorization": "Bearer third"}, 401),
    ({"Authorization": "Bearer first,second"}, 401), ({}, 401)])
def test_api_key_takes_a_comma_separated_list(two_keys: LiveApp, headers: dict[str, str],
                                              status: int) -> None:
    assert httpx.get(two_keys.url + "/v1/models", headers=headers).status_code == status


def test_offline_changes_no_start_option() -> None:  # it only stops Hub downloads
    assert parsed("--offline") == parsed()


@pytest.mark.parametrize("ignore", [True, False])
def test_generation_settings_report_the_logit_bias(http: httpx.Client, ignore: bool) -> None:
    done = http.post("/completion", json={"prompt": "Once upon a time", "n_predict": 2,
                                          "temperature": 0, "ignore_eos": ignore})
    assert done.status_code == 200, done.text
    bias = done.json()["generation_settings"]["logit_bias"]
    assert (len(bias) > 0) == ignore  # the EOG bans of ignore_eos, JSON null for -inf
    assert all(entry["bias"] is None and isinstance(entry["token"], int) for entry in bias)


def test_llama_servers_sampling_spellings_set_the_same_options() -> None:
    argv = ["--repeat-penalty", "1.1", "--repeat-last-n", "32", "--presence-penalty", "0.2",
            "--frequency-penalty", "0.3", "--top-nsigma", "1.5", "--typical", "0.9",
            "--dynatemp-exp", "1.2", "--mirostat-lr", "0.2", "--mirostat-ent", "4"]
    assert start_options(build_parser().parse_args(argv)) == {
        "penalty_repeat": 1.1, "penalty_last_n": 32, "penalty_present": 0.2,
        "penalty_freq": 0.3, "top_n_sigma": 1.5, "typical_p": 0.9, "dynatemp_exponent": 1.2,
        "mirostat_eta": 0.2, "mirostat_tau": 4.0}


@pytest.mark.parametrize("argv", [["--keep", "64"], ["--n-par", "2"], ["--cache-r", "0"]])
def test_a_flag_is_never_taken_for_a_longer_one(argv: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # llama-server's --keep (tokens kept on a context shift) was read as --keep-alive
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert f"unrecognized arguments: {argv[0]}" in capsys.readouterr().err


def test_llama_servers_slot_flags_set_the_engine_options() -> None:
    engine = parsed("-sps", "0.5", "--no-cache-idle-slots").engine
    assert (engine.slot_prompt_similarity, engine.cache_idle_slots) == (0.5, False)
    assert parsed("--cache-idle-slots").engine.cache_idle_slots is True
    with pytest.raises(InvalidOptionError, match="slot_prompt_similarity"):
        parsed("--slot-prompt-similarity", "1.5")


@pytest.fixture(scope="module")
def ignoring_eos(server: Server) -> Iterator[LiveApp]:
    with LiveApp(create_app(server, alias=MODEL_ALIAS, default_ignore_eos=True)) as app:
        yield app


def test_ignore_eos_flag_is_the_default_a_request_may_override(ignoring_eos: LiveApp) -> None:
    assert app_options(build_parser().parse_args(["--ignore-eos"]))["default_ignore_eos"]
    chat = {"messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 40,
            "temperature": 0}
    with httpx.Client(base_url=ignoring_eos.url, timeout=60) as http:
        past = http.post("/v1/chat/completions", json=chat).json()
        stops = http.post("/v1/chat/completions", json={**chat, "ignore_eos": False}).json()
    assert past["usage"]["completion_tokens"] == 40
    assert past["choices"][0]["finish_reason"] == "length"
    assert stops["choices"][0]["finish_reason"] == "stop"
    assert stops["usage"]["completion_tokens"] < 40


@pytest.mark.parametrize("argv", [["--samplers", "top_k;temperature"],
                                  ["--samplers", "top-k,temp"], ["--sampler-seq", "kt"],
                                  ["--sampling-seq", "kt"]])
def test_sampler_order_flags(argv: list[str]) -> None:
    options = serve_start_options(build_parser().parse_args(argv))
    assert resolve_start_options("x.gguf", options).engine.sampling.samplers == (
        "top_k", "temperature")


def test_llama_servers_gpu_split_spellings() -> None:
    model = parsed("-sm", "row", "-ts", "3,1", "-mg", "1").model
    assert (model.split_mode, model.tensor_split, model.main_gpu) == ("row", (3.0, 1.0), 1)


def test_chat_template_kwargs_flag_reaches_the_template(server: Server) -> None:
    args = build_parser().parse_args(["--chat-template-kwargs", '{"greeting": "HELLO"}',
                                      "--reasoning", "off"])
    kwargs = app_options(args)["template_kwargs"]
    assert kwargs == {"greeting": "HELLO", "enable_thinking": False}
    template = "{{ greeting }}{% for m in messages %}|{{ m.content }}{% endfor %}"
    app = create_app(server, alias=MODEL_ALIAS, chat_template=template, template_kwargs=kwargs)
    with LiveApp(app) as live:
        done = httpx.post(live.url + "/apply-template",
                          json={"messages": [{"role": "user", "content": "hi"}]})
    assert done.status_code == 200, done.text
    assert done.json()["prompt"].startswith("HELLO|hi")


@pytest.mark.parametrize("value", ["{nope", "[1, 2]"])
def test_a_bad_chat_template_kwargs_flag_is_refused(value: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from llamapy.serve.__main__ import main

    assert main(["--model", "/nonexistent/m.gguf", "--chat-template-kwargs", value]) == 2
    assert "--chat-template-kwargs" in capsys.readouterr().err


def test_logit_bias_flag_takes_llama_servers_form_and_repeats() -> None:
    argv = ["-l", "15043+1", "-l", "29871-inf", "--logit-bias", '{"5": -1.5}', "-l", "7-0.5"]
    bias = parsed(*argv).engine.sampling.logit_bias
    assert dict(bias) == {15043: 1.0, 29871: float("-inf"), 5: -1.5, 7: -0.5}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["-l", "15043*2"])
