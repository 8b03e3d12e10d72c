"""Session guarantees on the fake backend: plain Python inputs, restore compatibility, suffix
manifests, and decode timeouts that cancel (on a real tick thread)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from session_fakes import fake_manifest, fake_tokenize, open_fake

from llamapy.engine.engine import Engine
from llamapy.engine.fake.backend import FakeBackend
from llamapy.engine.options import EngineConfig, SamplingParams
from llamapy.errors import ManifestMismatchError, RequestTimeoutError
from llamapy.runtime import Hosted, TickLoop
from llamapy.session import (
    DecodeConfig,
    InlineHost,
    PrefixInput,
    Session,
    SessionConfig,
    SuffixInput,
)

PREFIX = tuple(range(2, 40))


def test_text_and_token_ids_are_accepted_where_inputs_are(engine: Engine) -> None:
    with open_fake(engine) as s:
        by_text = s.ensure_prefix("hello world")
        assert by_text.prefix_tokens == len(fake_tokenize("hello world", True))
        assert s.resident == fake_tokenize("hello world", True)
        assert s.ensure_prefix(list(PREFIX)).prefix_tokens == len(PREFIX)
        assert s.prefill_suffix(" tail").suffix_tokens == len(" tail")
        assert s.prefill_suffix((5, 6)).suffix_tokens == 2
        assert s.resident == [*PREFIX, 5, 6]


def test_decode_takes_keywords_and_a_config(engine: Engine) -> None:
    with open_fake(engine) as s:
        s.ensure_prefix(PREFIX)
        start = len(s.resident)
        list(s.decode(max_tokens=4, temperature=0.8, seed=3))
        by_keywords = s.resident[start:]
        s.ensure_prefix(PREFIX)
        list(s.decode(DecodeConfig(max_tokens=9, temperature=0.8), max_tokens=4, seed=3))
        assert s.resident[start:] == by_keywords and len(by_keywords) >= 1


@pytest.mark.parametrize("bad", [3.5, b"bytes", [1, "x"], None])
def test_other_input_types_are_a_type_error_naming_what_is_accepted(engine: Engine,
                                                                    bad: object) -> None:
    with open_fake(engine) as s:
        with pytest.raises(TypeError, match="PrefixInput, a str or a sequence of token ids"):
            s.ensure_prefix(bad)  # type: ignore[arg-type]
        s.ensure_prefix(PREFIX)
        with pytest.raises(TypeError, match="SuffixInput"):
            s.prefill_suffix(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="unknown keyword"):
            s.decode(max_tokenz=3)
        with pytest.raises(TypeError, match="DecodeConfig"):
            s.decode("fast")  # type: ignore[arg-type]
        assert s.explain_context().num_decode_tokens == 0


def test_restore_is_judged_on_verified_identity_not_declared_fields(engine: Engine) -> None:
    with open_fake(engine) as s:
        s.ensure_prefix(PrefixInput(token_ids=PREFIX, add_bos=False))
        snap = s.snapshot()
    assert snap.manifest.bos_policy == "no_bos"
    with open_fake(engine) as fresh:  # resident manifest: the host's ("bos")
        fresh.restore(snap)
        assert fresh.resident == list(PREFIX) and fresh.manifest.bos_policy == "no_bos"
        other_model = replace(snap, manifest=snap.manifest.replace(model_digest="other"))
        with pytest.raises(ManifestMismatchError) as info:
            fresh.restore(other_model)
        assert info.value.field == "model_digest"


def test_a_suffix_under_another_profile_is_refused(engine: Engine) -> None:
    with open_fake(engine) as s:
        s.ensure_prefix(PREFIX)
        other = fake_manifest(chat_template_digest="another template")
        before = s.explain_context()
        with pytest.raises(ManifestMismatchError) as info:
            s.prefill_suffix(SuffixInput(token_ids=(3,), manifest=other))
        assert info.value.field == "chat_template_digest"
        assert s.explain_context() == before
        same = SuffixInput(token_ids=(3,), manifest=s.manifest)
        assert s.prefill_suffix(same).suffix_tokens == 1


def test_a_decode_that_stalls_cancels_its_request_and_the_session_serves_on() -> None:
    backend = FakeBackend(n_ctx=2048, n_seq_max=1, n_batch=64, kv_unified=False, sleep_s=0.2)
    engine = Engine(backend, EngineConfig(n_parallel=1, n_batch=64, kv_unified=False,
                                          sampling=SamplingParams(seed=7, temp=0.8)))
    loop = TickLoop(lambda: Hosted(engine=engine))
    loop.ready.wait(5)
    host = InlineHost(engine, fake_manifest(), tokenize=fake_tokenize)
    host.runtime = loop  # type: ignore[assignment]  # the same session, on a real tick thread
    try:
        s = Session(host, SessionConfig(lease_timeout=5, request_timeout=5))
        s.ensure_prefix(PREFIX[:4])
        s.config = replace(s.config, request_timeout=0.05)
        chunks = list(s.decode(max_tokens=200))
        assert isinstance(chunks[-1].error, RequestTimeoutError)
        deadline = time.monotonic() + 5
        while loop.call(lambda e: e.stats().slots_active) and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = loop.call(lambda e: e.stats().as_dict())
        assert stats["slots_active"] == 0 and stats["num_cancelled"] == 1
        generated = s.explain_context().generated_tokens
        assert generated < 200 and not s.explain_context().fatal
        s.config = replace(s.config, request_timeout=5)
        assert s.prefill_suffix((3,)).suffix_tokens == 1
        assert s.resident == [*PREFIX[:4], 3]
        s.close()
        assert loop.call(lambda e: e.pool.leases) == {}
    finally:
        loop.close(5)

