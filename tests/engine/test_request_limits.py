"""Request options are bounded at the edge: C types, hashability, finite numbers, and the
serving limits (``max_*``) on the work one request may cause."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from llamapy.engine import Engine, EngineConfig, FakeBackend, FakeModel, Request
from llamapy.engine.request import ErrorEvent
from llamapy.engine.testing import Recorder, drain
from llamapy.errors import EngineError, InvalidOptionError, SamplingTooCostlyError
from llamapy.options import resolve_request_options
from llamapy.options.limits import RequestLimits, check_limits, fit_windows
from llamapy.options.sampling import SamplingParams

HUGE = (2**31, 2**32, 2**63, 2**64 + 1)


def resolve(**options: Any) -> Any:
    return resolve_request_options(options)


@pytest.mark.parametrize("session", [([1],), ((1, [2]),), ({"a": 1},)])
def test_an_unhashable_session_is_refused_naming_the_field(session: object) -> None:
    with pytest.raises(InvalidOptionError) as info:
        resolve(session=session)
    assert info.value.option == "session"


@pytest.mark.parametrize("name", ["top_k", "penalty_last_n", "dry_penalty_last_n",
                                  "dry_allowed_length", "n_probs"])
@pytest.mark.parametrize("value", HUGE)
def test_ints_that_reach_c_fit_int32(name: str, value: int) -> None:
    with pytest.raises(InvalidOptionError) as info:
        resolve(**{name: value})
    assert info.value.option == name
    resolve(**{name: 2**31 - 1})  # the largest int32 is accepted (bounded later by limits)


@pytest.mark.parametrize("name", ["temp", "top_p", "penalty_repeat", "dry_base",
                                  "mirostat_tau", "xtc_threshold"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_floats_must_be_finite(name: str, value: float) -> None:
    with pytest.raises(InvalidOptionError) as info:
        resolve(**{name: value})
    assert info.value.option == name


LIMITED: list[tuple[str, str, Any]] = [
    # (limit, field the error names, options of a request of size n)
    ("max_stop_strings", "stop", lambda n: {"stop": [f"s{i}" for i in range(n)]}),
    ("max_stop_length", "stop", lambda n: {"stop": ["x" * n]}),
    ("max_n_probs", "n_probs", lambda n: {"n_probs": n}),
    ("max_logit_bias", "logit_bias", lambda n: {"logit_bias": {i: 1.0 for i in range(n)}}),
    ("max_samplers", "samplers", lambda n: {"samplers": ["top_k"] * n}),
    ("max_dry_breakers", "dry_sequence_breakers",
     lambda n: {"dry_sequence_breakers": [f"b{i}" for i in range(n)]}),
    ("max_dry_breaker_length", "dry_sequence_breakers",
     lambda n: {"dry_sequence_breakers": ["y" * n]}),
    ("max_grammar_bytes", "grammar", lambda n: {"grammar": 'root ::= "' + "z" * (n - 11) + '"'}),
    ("max_grammar_depth", "grammar",
     lambda n: {"grammar": 'root ::= "(" [(] ' + "(" * n + '"x"' + ")" * n + " # ((("}),
]


@pytest.mark.parametrize(("limit", "field", "make"), LIMITED, ids=[x[0] for x in LIMITED])
def test_each_limit_allows_its_value_and_refuses_one_more(limit: str, field: str,
                                                          make: Any) -> None:
    limits = RequestLimits(**{limit: 20})
    check_limits(resolve(**make(20)), limits)
    with pytest.raises(InvalidOptionError) as info:
        check_limits(resolve(**make(21)), limits)
    assert info.value.option == field


def test_the_limits_are_start_options_and_cli_flags() -> None:
    from llamapy.serve.cli import build_parser

    config = EngineConfig(max_stop_strings=3)
    assert config.max_stop_strings == 3 and config.max_choices == 128
    help_text = build_parser().format_help()
    for name in RequestLimits.limit_names():
        assert "--" + name.replace("_", "-") in help_text
    with pytest.raises(InvalidOptionError):
        EngineConfig(max_n_probs=0)


def _engine(**config: Any) -> Engine:
    backend = FakeBackend(n_ctx=4096, n_seq_max=2, model=FakeModel(n_vocab=64))
    return Engine(backend, EngineConfig(n_parallel=2, **config))


def test_the_engine_checks_limits_and_the_vocabulary_itself() -> None:
    """A caller that builds a Request by hand meets the same bounds at ``Engine.submit``,
    which changes nothing when it refuses."""
    engine = _engine(max_stop_strings=2)
    with pytest.raises(InvalidOptionError, match="stop"):
        engine.submit(Request("a", [1, 2], resolve(stop=["a", "b", "c"])))
    with pytest.raises(InvalidOptionError, match="vocabulary"):
        engine.submit(Request("b", [1, 2], resolve(logit_bias={64: 1.0})))
    engine.check_integrity()
    assert not engine.runs and not engine.queue


def test_windows_reach_the_backend_fitted_to_the_context() -> None:
    """-1 ("the context") and windows past it become the context; others pass unchanged."""
    fitted = fit_windows(SamplingParams(penalty_last_n=-1, dry_penalty_last_n=2**31 - 1), 512)
    assert (fitted.penalty_last_n, fitted.dry_penalty_last_n) == (512, 512)
    same = SamplingParams(penalty_last_n=64, dry_penalty_last_n=0)
    assert fit_windows(same, 512) is same


class _SlowSampling(FakeBackend):
    """Sampling sleeps ``slow_s`` (a costly grammar) or raises a foreign error, for requests
    with those seeds."""

    def new_sampler(self, params: Any) -> Any:
        sampler = super().new_sampler(params)
        sample = sampler.sample

        def patched(row: int) -> int:
            if params.seed == 7:  # 50 ms of this thread's CPU, as a costly grammar spends
                deadline = time.thread_time() + 0.05
                while time.thread_time() < deadline:
                    pass
            if params.seed == 8:
                raise ZeroDivisionError("bug in a sampler")
            return sample(row)

        sampler.sample = patched
        return sampler


def test_a_run_whose_sampling_is_too_costly_or_raises_fails_alone() -> None:
    backend = _SlowSampling(n_ctx=4096, n_seq_max=3, model=FakeModel(n_vocab=64))
    engine = Engine(backend, EngineConfig(n_parallel=3, max_sample_ms=20))
    sinks = {name: Recorder() for name in ("slow", "bug", "fine")}
    seeds = {"slow": 7, "bug": 8, "fine": 9}
    for name, sink in sinks.items():
        options = resolve(seed=seeds[name], max_tokens=5, logit_bias={0: -math.inf})
        engine.submit(Request(name, [1, 2], options, sink=sink))
    drain(engine, each=engine.check_integrity)
    assert isinstance(sinks["slow"].final, ErrorEvent)
    assert isinstance(sinks["slow"].final.exc, SamplingTooCostlyError)
    assert isinstance(sinks["bug"].final, ErrorEvent)
    assert isinstance(sinks["bug"].final.exc, EngineError)
    assert sinks["fine"].finish_reason == "max_tokens" and len(sinks["fine"].tokens) == 5
    assert not backend.open_samplers


def test_a_queued_run_that_cannot_be_routed_fails_alone() -> None:
    """Admission routes each queued run on its own: one that raises (here an unhashable
    session forced past every check) ends with ``EngineError``, the others are admitted."""
    engine = _engine()
    sinks = {i: Recorder() for i in range(4)}
    for i, sink in sinks.items():
        options = resolve(seed=i, max_tokens=3, logit_bias={0: -math.inf})
        engine.submit(Request(i, [1, 2 + i], options, sink=sink))
    queued = engine.runs[3].request.options
    object.__setattr__(queued, "session", ([1],))
    drain(engine, each=engine.check_integrity)
    assert isinstance(sinks[3].final, ErrorEvent)
    assert isinstance(sinks[3].final.exc, EngineError)
    assert all(sinks[i].finish_reason == "max_tokens" for i in range(3))


@pytest.mark.parametrize("options", [{"temp": 10**400}, {"logit_bias": {1: math.inf}},
                                     {"logit_bias": {1: 10**400}}, {"speculative": {1: 2}},
                                     {"session": tuple(range(17))}, {"session": "s" * 257}])
def test_python_callers_meet_the_same_bounds(options: dict[str, Any]) -> None:
    """What JSON cannot carry but a Python caller can: ints past a double, +inf, non-string
    setting names, sessions too large to hash at every admission."""
    with pytest.raises(InvalidOptionError):
        resolve(**options)
    resolve(logit_bias={1: -math.inf}, session=("conversation", 7))  # -inf still bans


def test_seeded_choices_stay_seeds_past_the_last_uint32() -> None:
    from llamapy.openai_api.params import choice_seed

    seeds = [choice_seed(2**32 - 2, i) for i in range(3)]
    assert seeds == [2**32 - 2, 0, 1]  # 2**32 - 1 would mean "random"
    for seed in seeds:
        resolve(seed=seed)
