"""Media chunks in the engine, on the fake backend: planning, reuse, validation."""

from __future__ import annotations

import pytest
from engine_helpers import make_engine, ref

from llamapy.engine import Request, RequestOptions, SamplingParams
from llamapy.engine.fake.media import fake_media_chunk
from llamapy.engine.media import MediaSpan, is_media_token, media_token_ids
from llamapy.engine.testing import Recorder, drain
from llamapy.errors import InvalidOptionError


def media_prompt(before: list[int], data: bytes, after: list[int]) -> tuple[list[int], tuple]:
    chunk = fake_media_chunk(data)
    return [*before, *chunk.token_ids, *after], (MediaSpan(len(before), chunk),)


def submit_media(engine, rid, prompt, spans, max_tokens=4, **options) -> Recorder:
    sink = Recorder()
    opts = RequestOptions(max_tokens=max_tokens, sampling=SamplingParams(seed=1), **options)
    engine.submit(Request(rid, prompt, opts, sink, media=spans))
    return sink


def test_media_ids_are_negative_distinct_and_stable() -> None:
    a, b = fake_media_chunk(b"cat"), fake_media_chunk(b"dog")
    assert all(is_media_token(t) for t in a.token_ids)
    assert a.token_ids == fake_media_chunk(b"cat").token_ids
    assert not set(a.token_ids) & set(b.token_ids)
    assert len(set(media_token_ids(a.digest, 1000))) == 1000


def test_a_media_prompt_matches_the_reference_and_decodes_its_rows() -> None:
    engine, backend = make_engine()
    prompt, spans = media_prompt([1, 2, 3], b"an image", [4, 5])
    sink = submit_media(engine, "r", prompt, spans)
    drain(engine, each=backend.check_integrity)
    assert sink.finish_reason == "max_tokens"
    assert sink.tokens == ref(backend, prompt, 4)
    assert backend.violations == []
    media_segments = [s for p in backend.plans for s in p.segments if s.media is not None]
    assert sum(len(s.token_ids) for s in media_segments) == spans[0].chunk.n_tokens
    for plan in backend.plans:  # text and media never share a slot's segment
        for seg in plan.segments:
            assert (seg.media is None) == all(t >= 0 for t in seg.token_ids)


def test_media_rows_are_split_under_the_chunk_budget() -> None:
    engine, backend = make_engine(chunk_size=3, n_batch=3)
    prompt, spans = media_prompt([7], b"12345", [8, 9])  # 7 rows
    sink = submit_media(engine, "r", prompt, spans)
    drain(engine, each=backend.check_integrity)
    assert sink.tokens == ref(backend, prompt, 4)
    firsts = [s.media.first for p in backend.plans for s in p.segments if s.media is not None]
    assert firsts == [0, 3, 6]
    assert backend.violations == []


def test_the_same_image_is_reused_and_another_is_not() -> None:
    engine, backend = make_engine(n_parallel=1)
    prompt, spans = media_prompt([1, 2], b"photo", [3, 4, 5])
    first = submit_media(engine, "a", prompt, spans)
    drain(engine)
    again = submit_media(engine, "b", [*prompt, 6], spans)
    drain(engine)
    assert again.final.timings.reused_tokens == len(prompt)
    other, other_spans = media_prompt([1, 2], b"photp", [3, 4, 5])
    third = submit_media(engine, "c", other, other_spans)
    drain(engine)
    assert third.final.timings.reused_tokens == 2
    assert first.tokens == ref(backend, prompt, 4)
    assert third.tokens == ref(backend, other, 4)
    assert third.tokens != first.tokens or other != prompt
    assert backend.violations == []


@pytest.mark.parametrize("case", ["ids", "overlap", "outside", "ends", "stray"])
def test_malformed_media_is_refused_at_submit(case: str) -> None:
    engine, _ = make_engine()
    prompt, spans = media_prompt([1], b"img", [2])
    chunk = spans[0].chunk
    if case == "ids":
        prompt[1] = -5
    elif case == "overlap":
        spans = (spans[0], MediaSpan(2, chunk))
    elif case == "outside":
        spans = (MediaSpan(len(prompt) - 1, chunk),)
    elif case == "ends":
        prompt = prompt[:-1]
    elif case == "stray":
        prompt, spans = [1, -3, 2], ()
    with pytest.raises(InvalidOptionError):
        submit_media(engine, "r", prompt, spans)


def test_a_prompt_ending_in_media_may_prefill_only() -> None:
    engine, backend = make_engine()
    prompt, spans = media_prompt([1], b"img", [])
    sink = submit_media(engine, "r", prompt, spans, max_tokens=0)
    drain(engine)
    assert sink.finish_reason == "prefill"
    assert backend.seq_tokens(0)[-1] == prompt[-1] or backend.seq_tokens(1)[-1] == prompt[-1]


def test_disk_entries_keep_media_ids_and_tell_media_apart() -> None:
    import io

    from llamapy.engine.cache.disk_format import encode_entry, read_header, read_state
    from llamapy.engine.cache.disk_store import entry_name

    prompt, _ = media_prompt([1, 2], b"picture", [3])
    other, _ = media_prompt([1, 2], b"picturf", [3])
    ident = bytes(32)
    blob = b"".join(encode_entry(ident, "s", prompt, b"state"))
    f = io.BytesIO(blob)
    header = read_header(f, len(blob))
    assert header.token_ids == tuple(prompt)
    assert read_state(f, header) == b"state"
    assert entry_name(ident, prompt) != entry_name(ident, other)
    assert entry_name(ident, [1, 2, 3]) == entry_name(ident, (1, 2, 3))


def test_the_disk_tier_restores_a_media_prefix(tmp_path) -> None:
    from llamapy.engine import EngineTuning
    from llamapy.engine.cache.disk import CacheNamespace

    prompt, spans = media_prompt([1, 2, 3], b"on disk", [4, 5, 6])
    outputs = []
    for rid in ("write", "read"):  # a "restart": a new engine on the same folder
        tuning = EngineTuning(ram_min_tokens=4, disk_min_tokens=4, disk_background=False)
        engine, backend = make_engine(n_parallel=1, cache_namespace=CacheNamespace("fake"),
                                      prompt_cache_dir=str(tmp_path), prompt_cache_ram_mb=0,
                                      tuning=tuning)
        sink = submit_media(engine, rid, prompt, spans)
        drain(engine)
        engine.close()
        outputs.append(sink)
    assert outputs[1].final.timings.reused_tokens > len(spans[0].chunk.token_ids)
    assert outputs[0].tokens == outputs[1].tokens == ref(backend, prompt, 4)


def bidirectional_prompt(before, data, after):
    chunk = fake_media_chunk(data, causal=False)
    return [*before, *chunk.token_ids, *after], (MediaSpan(len(before), chunk),)


def test_a_bidirectional_chunk_is_decoded_whole_past_the_chunk_budget() -> None:
    engine, backend = make_engine(chunk_size=3, n_batch=16)
    prompt, spans = bidirectional_prompt([7, 8], b"123456", [9, 9, 9])  # 8 rows
    sink = submit_media(engine, "r", prompt, spans)
    drain(engine, each=backend.check_integrity)
    assert sink.tokens == ref(backend, prompt, 4)
    media = [(s.media.first, len(s.token_ids)) for p in backend.plans for s in p.segments
             if s.media is not None]
    assert media == [(0, 8)]
    assert backend.violations == []


def test_a_bidirectional_chunk_larger_than_n_batch_is_refused() -> None:
    engine, _ = make_engine(n_batch=4, chunk_size=4)
    prompt, spans = bidirectional_prompt([1], b"123456", [2])
    with pytest.raises(InvalidOptionError, match="n_batch"):
        submit_media(engine, "r", prompt, spans)


def test_reuse_never_ends_inside_a_bidirectional_chunk() -> None:
    """A slot whose KV ends inside a chunk (a pin cut it there) is reused only up to the
    chunk's start: the chunk is decoded whole again."""
    engine, backend = make_engine(n_parallel=1)
    prompt, spans = bidirectional_prompt([1, 2, 3], b"whole", [4, 5])
    chunk = spans[0].chunk
    submit_media(engine, "a", prompt, spans)
    drain(engine)
    inside = spans[0].start + 2
    backend.seq_rm(0, inside, -1)  # as if the slot's KV had been cut inside the chunk
    engine.pool.slots[0].cached = engine.pool.slots[0].cached[:inside]
    again = submit_media(engine, "b", prompt, spans)
    drain(engine, each=backend.check_integrity)
    assert again.final.timings.reused_tokens == spans[0].start
    assert again.tokens == ref(backend, prompt, 4)
    assert chunk.n_tokens > 2 and backend.violations == []
