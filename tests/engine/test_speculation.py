"""Speculative decoding on the fake backend: drafts change how fast, never what is generated.

The fake sampler is a pure function of (history, seed), so with any drafter, greedy or sampled,
a request's tokens must equal the oracle's and its events those of a run without speculation.
Every tick is followed by engine and backend integrity checks (the backend records a violation
when a draft's ``draft_tag`` is not the verifying request's cache key).
"""

from __future__ import annotations

import pytest
from spec_helpers import (
    CPU_COST,
    ENDLESS,
    GPU_COST,
    MODEL,
    PROMPTS,
    SMALL,
    SMALL_PROMPTS,
    AuditedNgramDrafter,
    Job,
    LeakyDrafter,
    OracleDrafter,
    assert_reference,
    check_all,
    checked_drain,
    job,
    mixed_jobs,
    reference_of,
    run_jobs,
    spec_engine,
    submit_jobs,
    transcript,
)

from llamapy.engine import (
    FakeBackend,
    FakeModel,
    Request,
    SamplingParams,
)
from llamapy.engine.speculation.speculator import EXPLORE_EVERY, MIN_STEPS_BEFORE_OFF
from llamapy.engine.testing import Recorder, drain

# --- the proofs: the oracle drafter and the backend's violation check ------------------------


def test_oracle_drafter_proposes_the_true_continuation():
    drafter = OracleDrafter(MODEL)
    engine, backend = spec_engine(drafter=drafter, model=MODEL, spec_type="draft",
                                  spec_adaptive=False, spec_draft_n_max=5)
    jobs = mixed_jobs(PROMPTS, adapters=(("l.gguf", 1.0),))  # the adapter salt matters
    run_jobs(engine, backend, jobs)
    refs = {j.request_id: reference_of(backend, j) for j in jobs}
    assert drafter.proposals
    for p in drafter.proposals:
        expected = refs[p.request_id][p.num_generated:p.num_generated + len(p.tokens)]
        assert list(p.tokens[:len(expected)]) == expected
    # Every proposal was verified, and accepted up to the request's end (EOG included).
    c = engine.counters
    assert c.num_draft_tokens == sum(len(p.tokens) for p in drafter.proposals)
    assert c.num_draft_accepted == sum(min(len(p.tokens), len(refs[p.request_id]) -
                                           p.num_generated) for p in drafter.proposals) > 0


def test_a_draft_from_another_key_is_caught_by_the_fake_backend():
    engine, backend = spec_engine(drafter=LeakyDrafter(ENDLESS), model=ENDLESS,
                                  spec_type="draft")
    submit_jobs(engine, [job(1, PROMPTS[0], max_tokens=8)])
    with pytest.raises(AssertionError, match="verifies a draft proposed from"):
        drain(engine, each=backend.check_integrity)
    assert "'elsewhere'" in backend.violations[0]


def test_the_honest_oracle_passes_the_same_check():
    engine, backend = spec_engine(drafter=OracleDrafter(ENDLESS), model=ENDLESS,
                                  spec_type="draft")
    run_jobs(engine, backend, [job(1, PROMPTS[0], max_tokens=8)])
    assert not backend.violations and engine.counters.num_draft_tokens > 0


# --- outputs equal the oracle --------------------------------------------------------------


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("error_rate", [0.0, 0.3, 0.9])
def test_outputs_with_an_oracle_drafter_equal_the_reference(error_rate, adaptive):
    drafter = OracleDrafter(MODEL, error_rate, seed=5)
    engine, backend = spec_engine(drafter=drafter, model=MODEL, n_parallel=3,
                                  spec_type="draft", spec_adaptive=adaptive,
                                  spec_draft_n_max=6)
    jobs = mixed_jobs(PROMPTS)
    run_jobs(engine, backend, jobs)
    assert_reference(backend, jobs)
    c = engine.counters
    assert c.num_draft_tokens > 0
    if error_rate == 0.0:
        assert c.num_draft_accepted > c.num_draft_tokens // 2


def test_outputs_with_the_ngram_drafter_equal_the_reference():
    ngram = AuditedNgramDrafter()
    engine, backend = spec_engine(model=SMALL, ngram=ngram, n_parallel=3, spec_type="ngram",
                                  spec_adaptive=False)
    jobs = mixed_jobs(SMALL_PROMPTS, max_tokens=40)
    run_jobs(engine, backend, jobs)
    assert_reference(backend, jobs)
    assert ngram.num_proposed > 0
    assert engine.counters.num_draft_accepted > 0


def test_speculation_across_adapter_sets_equals_the_reference():
    drafter = OracleDrafter(MODEL, 0.3, seed=2)
    engine, backend = spec_engine(drafter=drafter, model=MODEL, n_parallel=3, spec_type="draft")
    jobs = [job(i, PROMPTS[0], adapters=a, temp=0.8, seed=i)
            for i, a in enumerate([(), (("a.gguf", 1.0),), (("b.gguf", 0.5),)])]
    run_jobs(engine, backend, jobs)
    assert_reference(backend, jobs)
    assert engine.counters.num_draft_accepted > 0


def test_no_speculation_without_partial_kv_removal():
    drafter = OracleDrafter(MODEL)
    engine, backend = spec_engine(drafter=drafter, model=MODEL, partial=False,
                                  spec_type="draft")
    jobs = mixed_jobs(PROMPTS[:1])
    run_jobs(engine, backend, jobs)
    assert_reference(backend, jobs)
    assert not drafter.proposals and engine.counters.num_draft_tokens == 0


def test_the_engine_closes_its_drafters():
    drafter = OracleDrafter(MODEL)
    engine, _ = spec_engine(drafter=drafter, model=MODEL, spec_type="draft")
    engine.close()
    assert drafter.closed


# --- what the consumer sees is unchanged ---------------------------------------------------


def stop_string_at(model: FakeModel, tokens: list[int], k: int) -> str | None:
    """The piece of ``tokens[k]`` as a stop string when it first occurs with that token."""
    piece = model.pieces[tokens[k]]
    if not piece.startswith(b" w"):
        return None
    before = b"".join(model.pieces[t] for t in tokens[:k]).decode("utf-8", "replace")
    stop = piece.decode()
    return stop if (before + stop).find(stop) == len(before) else None


def events_jobs(model: FakeModel, prompts) -> list[Job]:
    """Greedy and sampled requests, some with logprobs, some with a stop string that fires
    (one within a token, one spanning two)."""
    jobs = []
    for i, prompt in enumerate(prompts):
        for temp in (0.0, 0.8):
            base = job(f"{i}-{temp}", prompt, max_tokens=30, temp=temp, seed=i)
            ref = reference_of(FakeBackend(model=model), base)
            stops = [s for k in range(3, len(ref) - 1) if (s := stop_string_at(model, ref, k))]
            spanning = model.pieces[ref[min(2, len(ref) - 1)]].decode("utf-8", "replace")
            spanning = spanning[-2:] + " w"
            jobs.append(job(f"{i}-{temp}-stop", prompt, max_tokens=30, temp=temp, seed=i,
                            stop=tuple(stops[:1])))
            jobs.append(job(f"{i}-{temp}-span", prompt, max_tokens=30, temp=temp, seed=i,
                            stop=(spanning,), n_probs=2))
            jobs.append(job(f"{i}-{temp}-probs", prompt, max_tokens=30, temp=temp, seed=i,
                            n_probs=3))
    return jobs


@pytest.mark.parametrize("setup", ["oracle-0", "oracle-0.5", "ngram"])
def test_token_events_are_identical_with_and_without_speculation(setup):
    model, prompts = (SMALL, SMALL_PROMPTS) if setup == "ngram" else (MODEL, PROMPTS)
    off_engine, off_backend = spec_engine(model=model, n_parallel=3)
    off = events_jobs(model, prompts)
    run_jobs(off_engine, off_backend, off)
    drafter = OracleDrafter(model, 0.5 if setup == "oracle-0.5" else 0.0, seed=9)
    on_engine, on_backend = spec_engine(
        drafter=drafter, model=model, n_parallel=3, spec_adaptive=False,
        spec_type="ngram" if setup == "ngram" else "draft", ngram=AuditedNgramDrafter())
    on = events_jobs(model, prompts)
    run_jobs(on_engine, on_backend, on)
    assert off_engine.counters.num_draft_tokens == 0
    assert on_engine.counters.num_draft_tokens > 0
    reasons = set()
    for a, b in zip(off, on, strict=True):
        assert transcript(b.sink) == transcript(a.sink), f"{a.request_id} differs"
        reasons.add(a.sink.finish_reason)
    assert {"stop", "eog"} <= reasons
    assert any(a.sink.finish_reason == "stop" for a in off if a.request_id.endswith("-span"))
    assert any(a.sink.events[0].logprobs for a in off)


def test_a_stop_string_inside_an_accepted_draft_ends_the_request_there():
    drafter = OracleDrafter(ENDLESS)
    engine, backend = spec_engine(drafter=drafter, model=ENDLESS, n_parallel=1,
                                  spec_type="draft", spec_adaptive=False, spec_draft_n_max=8)
    prompt = [*range(1, 9)]
    ref = ENDLESS.reference(prompt, 40, SamplingParams(seed=1, temp=0.8))
    k, stop = next((k, s) for k in range(4, 30) if (s := stop_string_at(ENDLESS, ref, k)))
    (sink,) = run_jobs(engine, backend, [job(1, prompt, max_tokens=40, temp=0.8, stop=(stop,))])
    assert sink.finish_reason == "stop" and sink.tokens == ref[:k + 1]
    full = b"".join(ENDLESS.pieces[t] for t in ref[:k + 1]).decode("utf-8", "replace")
    assert sink.text == full[:full.rfind(stop)]
    assert any(p.num_generated <= k < p.num_generated + len(p.tokens) - 1
               for p in drafter.proposals), "no draft reached past the stop"
    assert backend.seq_tokens(0) == prompt + ref[:k], "KV past the stop was not removed"


def test_eog_inside_an_accepted_draft_ends_the_request_there():
    drafter = OracleDrafter(MODEL)  # continues its proposals past EOG
    engine, backend = spec_engine(drafter=drafter, model=MODEL, n_parallel=1,
                                  spec_type="draft", spec_adaptive=False, spec_draft_n_max=8)
    prompt = [*range(1, 9)]
    seed, ref = next((s, r) for s in range(500)
                     if 4 <= len(r := MODEL.reference(prompt, 40, SamplingParams(seed=s,
                                                                                  temp=0.8))) <= 8
                     and r[-1] == MODEL.eog_token)
    (sink,) = run_jobs(engine, backend, [job(1, prompt, max_tokens=40, temp=0.8, seed=seed)])
    assert sink.finish_reason == "eog" and sink.tokens == ref
    eog_at = len(ref) - 1
    assert any(p.num_generated <= eog_at < p.num_generated + len(p.tokens) - 1
               for p in drafter.proposals), "no draft reached past the EOG"
    c = engine.counters
    assert 0 < c.num_draft_accepted < c.num_draft_tokens
    assert backend.seq_tokens(0) == prompt + ref[:-1], "KV past the EOG was not removed"


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 9, 17])
def test_drafts_never_go_past_max_tokens(max_tokens):
    drafter = OracleDrafter(ENDLESS)  # perfect: always proposes n_max tokens
    engine, backend = spec_engine(drafter=drafter, model=ENDLESS, n_parallel=1,
                                  spec_type="draft", spec_adaptive=False, spec_draft_n_max=16)
    prompt = PROMPTS[0]
    (sink,) = run_jobs(engine, backend, [job(1, prompt, max_tokens=max_tokens)])
    assert sink.finish_reason == "max_tokens" and len(sink.tokens) == max_tokens
    for p in drafter.proposals:
        assert p.num_generated + p.n_max + 1 <= max_tokens, p
    for plan in backend.plans:
        for seg in plan.segments:
            assert seg.start_pos + len(seg.token_ids) <= len(prompt) + max_tokens - 1
    c = engine.counters
    assert c.num_generated_tokens == max_tokens
    assert c.num_draft_tokens == c.num_draft_accepted
    assert c.num_draft_tokens == max(0, max_tokens - 2)  # one step drafts all the rest
    assert c.num_draft_steps == (1 if max_tokens > 2 else 0)


# --- adaptive draft length -----------------------------------------------------------------


def one_request(drafter: OracleDrafter, max_tokens: int, **config):
    engine, backend = spec_engine(drafter=drafter, model=ENDLESS, n_parallel=1,
                                  spec_type="draft", spec_draft_n_max=8, **config)
    j = job(1, PROMPTS[0], max_tokens=max_tokens, temp=0.8)
    run_jobs(engine, backend, [j])
    assert j.sink.tokens == reference_of(backend, j)
    (run,) = drafter.finished_runs
    assert run.spec is not None
    return engine, run.spec


def test_adaptive_speculation_switches_off_for_an_always_wrong_drafter():
    drafter = OracleDrafter(ENDLESS, error_rate=1.0)
    engine, spec = one_request(drafter, 200, spec_adaptive=True, cost=CPU_COST)
    assert not spec.active and spec.accepted == 0
    assert MIN_STEPS_BEFORE_OFF <= spec.steps <= MIN_STEPS_BEFORE_OFF + 2
    assert spec.steps == engine.counters.num_draft_steps
    # after the first rejections only one-token probes are verified, then none at all
    assert spec.drafted <= 8 + MIN_STEPS_BEFORE_OFF
    last = max(p.num_generated for p in drafter.proposals if p.n_max > 0)
    assert last < 200 - 8 * EXPLORE_EVERY, "drafting did not stop"


def test_without_adaptive_a_wrong_drafter_keeps_drafting():
    drafter = OracleDrafter(ENDLESS, error_rate=1.0)
    engine, spec = one_request(drafter, 60, spec_adaptive=False, cost=CPU_COST)
    assert spec.active and spec.accepted == 0
    assert spec.steps == engine.counters.num_draft_steps == 58  # every decode but the last


@pytest.mark.parametrize("cost", [CPU_COST, GPU_COST], ids=["cpu", "gpu"])
def test_a_perfect_drafter_grows_the_draft_to_n_max(cost):
    drafter = OracleDrafter(ENDLESS)
    engine, spec = one_request(drafter, 120, spec_adaptive=True, cost=cost)
    asked = [p.n_max for p in drafter.proposals if p.num_generated + 9 < 120]
    assert asked[0] < 8 and asked[-1] == 8
    assert spec.active and spec.accepted == spec.drafted
    expected_beta = 3 / 13 if cost is CPU_COST else 0.01  # 3 ms per token over 13 ms; floor
    assert engine.speculator.cost.beta == pytest.approx(expected_beta, rel=1e-6)


# --- per-request settings, timings ---------------------------------------------------------


def test_speculative_off_overrides_a_server_default_of_ngram():
    engine, backend = spec_engine(model=SMALL, n_parallel=1, spec_type="ngram",
                                  spec_adaptive=False)
    prompt = SMALL_PROMPTS[0]
    for value in ("off", False, {"type": "off"}, {"n_max": 0}):
        j = job(str(value), prompt, max_tokens=40, speculative=value)
        submit_jobs(engine, [j])
        assert engine.runs[j.request_id].spec is None
        checked_drain(engine, backend)
        assert j.sink.tokens == reference_of(backend, j)
    assert engine.counters.num_draft_tokens == 0
    run_jobs(engine, backend, [job("default", prompt, max_tokens=40)])
    assert engine.counters.num_draft_tokens > 0


def test_speculative_mapping_caps_the_draft():
    drafter = OracleDrafter(ENDLESS)
    engine, backend = spec_engine(drafter=drafter, model=ENDLESS, n_parallel=2,
                                  spec_type="draft", spec_adaptive=False, spec_draft_n_max=8)
    jobs = [job("capped", PROMPTS[0], max_tokens=30, speculative={"n_max": 2}),
            job("default", PROMPTS[1], max_tokens=30)]
    run_jobs(engine, backend, jobs)
    assert_reference(backend, jobs)
    asked = {rid: {p.n_max for p in drafter.proposals if p.request_id == rid}
             for rid in ("capped", "default")}
    assert max(asked["capped"]) == 2 and max(asked["default"]) == 8
    lens = {seg.seq_id: 0 for plan in backend.plans for seg in plan.segments}
    for plan in backend.plans:
        for seg in plan.segments:
            lens[seg.seq_id] = max(lens[seg.seq_id], seg.n_outputs - 1)
    assert sorted(lens.values()) == [2, 8]


def test_speculative_names_a_drafter_when_the_server_default_is_off():
    drafter = OracleDrafter(ENDLESS)
    engine, backend = spec_engine(drafter=drafter, model=ENDLESS, n_parallel=2)
    jobs = [job("draft", PROMPTS[0], max_tokens=20, speculative="draft"),
            job("mapping", PROMPTS[1], max_tokens=20, speculative={"type": "draft", "n_max": 3}),
            job("plain", PROMPTS[2], max_tokens=20)]
    run_jobs(engine, backend, jobs)
    assert_reference(backend, jobs)
    assert {p.request_id for p in drafter.proposals} == {"draft", "mapping"}
    assert max(p.n_max for p in drafter.proposals if p.request_id == "mapping") == 3


def test_a_drafter_the_server_lacks_turns_speculation_off():
    engine, backend = spec_engine(model=MODEL, spec_type="draft")  # no "draft" registered
    (sink,) = run_jobs(engine, backend, [j := job(1, PROMPTS[0])])
    assert sink.tokens == reference_of(backend, j) and engine.counters.num_draft_tokens == 0


def test_timings_count_each_requests_drafts():
    drafter = OracleDrafter(MODEL, 0.3, seed=4)
    engine, backend = spec_engine(drafter=drafter, model=MODEL, n_parallel=1,
                                  spec_type="draft", spec_adaptive=False)
    c = engine.counters
    for j in mixed_jobs(PROMPTS):
        drafted, accepted = c.num_draft_tokens, c.num_draft_accepted
        (sink,) = run_jobs(engine, backend, [j])
        timings = sink.final.timings
        assert timings.draft_tokens == c.num_draft_tokens - drafted
        assert timings.draft_accepted == c.num_draft_accepted - accepted
    assert c.num_draft_accepted > 0
    assert sum(c.draft_accepted_per_pos[:1]) <= c.num_draft_steps
    assert sum(c.draft_accepted_per_pos) == c.num_draft_accepted
    assert c.draft_accepted_per_pos == sorted(c.draft_accepted_per_pos, reverse=True)


def test_timings_of_concurrent_requests_add_up_to_the_counters():
    drafter = OracleDrafter(MODEL, 0.3, seed=4)
    engine, backend = spec_engine(drafter=drafter, model=MODEL, n_parallel=3,
                                  spec_type="draft")
    sinks = run_jobs(engine, backend, mixed_jobs(PROMPTS))
    c = engine.counters
    assert sum(s.final.timings.draft_tokens for s in sinks) == c.num_draft_tokens > 0
    assert sum(s.final.timings.draft_accepted for s in sinks) == c.num_draft_accepted
    check_all(engine, backend)


def test_a_consumer_gone_mid_draft_gets_no_more_tokens():
    def run(spec_type: str) -> Recorder:
        engine, backend = spec_engine(drafter=OracleDrafter(ENDLESS), model=ENDLESS,
                                      n_parallel=1, spec_type=spec_type, spec_adaptive=False)
        sink = Recorder()
        sink.on_event = lambda _: setattr(sink, "gone", len(sink.tokens) >= 3)
        j = job(1, PROMPTS[0], max_tokens=20)
        engine.submit(Request(j.request_id, j.prompt, j.options, sink))
        checked_drain(engine, backend)
        assert engine.counters.num_draft_tokens == (16 if spec_type == "draft" else 0)
        return sink

    plain, spec = run("off"), run("draft")
    assert spec.tokens == plain.tokens and len(spec.tokens) == 3
    assert spec.finish_reason == plain.finish_reason == "cancelled"
    assert spec.final.completion_tokens == 3
