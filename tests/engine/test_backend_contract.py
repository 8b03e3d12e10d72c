"""The Backend contract, on the fake backend.

Written against the protocol only (except the tests marked fake-specific at the bottom):
``tests/integration/test_backend_contract_llama.py`` runs every test here that takes the
``backend`` fixture against ``LlamaBackend`` on the real model.
"""

from __future__ import annotations

import pytest

from llamapy.engine import Backend, BatchPlan, FakeBackend, Sampler, SamplingParams, Segment
from llamapy.errors import GrammarError, InvalidBatchError, KVCacheFullError


@pytest.fixture
def backend() -> Backend:
    return FakeBackend(n_ctx=64, n_seq_max=4, n_batch=32)


def decode(backend: Backend, *segments: Segment) -> BatchPlan:
    plan = BatchPlan(list(segments))
    backend.decode(plan)
    return plan


def test_is_a_backend_with_limits(backend):
    assert isinstance(backend, Backend)
    assert (backend.n_seq_max, backend.n_batch) == (4, 32) and backend.n_ctx >= 64
    n_ctx = backend.n_ctx
    assert backend.n_ctx_seq == (n_ctx if backend.kv_unified else n_ctx // backend.n_seq_max)
    assert backend.n_vocab > 2


def test_batch_plan_output_indices():
    plan = BatchPlan([Segment(0, 0, [1, 2, 3], True), Segment(1, 0, [4], False),
                      Segment(2, 5, [5, 6], True)])
    assert plan.n_tokens == 6 and plan.offsets == [0, 3, 4]
    assert [plan.output_index(i) for i in range(3)] == [2, 3, 5]
    assert plan.output_indices() == [2, None, 5]


def test_decode_then_positions_advance(backend):
    decode(backend, Segment(0, 0, [1, 2, 3], True), Segment(1, 0, [3], True))
    assert (backend.seq_pos_max(0), backend.seq_pos_max(1), backend.seq_pos_max(2)) == (2, 0, -1)
    decode(backend, Segment(0, 3, [4], True))
    assert backend.seq_pos_max(0) == 3


@pytest.mark.parametrize("segment", [
    Segment(0, 1, [1], True),          # positions must continue at pos_max + 1
    Segment(0, 0, [1] * 33, True),     # more than n_batch
    Segment(9, 0, [1], True),          # unknown sequence
])
def test_invalid_batches(backend, segment):
    with pytest.raises(InvalidBatchError):
        decode(backend, segment)
    assert backend.seq_pos_max(0) == -1


def test_kv_full_changes_nothing():
    backend = FakeBackend(n_ctx=8, n_seq_max=2, n_batch=8)
    decode(backend, Segment(0, 0, [1] * 6, True))
    with pytest.raises(KVCacheFullError):
        decode(backend, Segment(0, 6, [1], True), Segment(1, 0, [1, 1, 1], True))
    assert (backend.seq_pos_max(0), backend.seq_pos_max(1)) == (5, -1)


def test_seq_rm_partial_and_whole(backend):
    decode(backend, Segment(0, 0, [1, 2, 3, 4], True))
    assert backend.seq_rm(0, 2, -1) and backend.seq_pos_max(0) == 1
    assert backend.seq_rm(0, 0, -1) and backend.seq_pos_max(0) == -1


def test_seq_cp_shares_a_prefix_then_sequences_diverge(backend):
    decode(backend, Segment(0, 0, [1, 2, 3, 4], True))
    backend.seq_cp(0, 1, 0, 3)
    assert backend.seq_pos_max(1) == 2
    decode(backend, Segment(1, 3, [4], True))
    params = SamplingParams(seed=3)
    s0, s1 = backend.new_sampler(params), backend.new_sampler(params)
    decode(backend, Segment(0, 4, [5], True), Segment(1, 4, [5], True))
    assert s0.sample(0) == s1.sample(1)  # same history, same seed: same token


def test_seq_keep_and_clear(backend):
    decode(backend, Segment(0, 0, [1, 2], True), Segment(1, 0, [1], True))
    backend.seq_keep(1)
    assert (backend.seq_pos_max(0), backend.seq_pos_max(1)) == (-1, 0)
    backend.clear()
    assert backend.seq_pos_max(1) == -1


def test_state_roundtrip_gives_the_same_next_token(backend):
    decode(backend, Segment(0, 0, [3, 1, 4, 1, 5], True))
    token = backend.new_sampler(SamplingParams(seed=9)).sample(4)
    data = backend.state_seq_get(0)
    assert backend.state_seq_set(2, data) and backend.seq_pos_max(2) == 4
    backend.seq_rm(2, 4, -1)
    decode(backend, Segment(2, 4, [5], True))
    assert backend.new_sampler(SamplingParams(seed=9)).sample(0) == token


def test_state_size_is_the_length_of_the_serialised_state(backend):
    assert backend.state_seq_size(1) == len(backend.state_seq_get(1))  # empty sequence
    decode(backend, Segment(0, 0, [3, 1, 4], True), Segment(1, 0, [2, 7, 1, 8, 2, 8], True))
    sizes = [backend.state_seq_size(seq) for seq in (0, 1)]
    assert sizes == [len(backend.state_seq_get(seq)) for seq in (0, 1)]
    assert sizes[0] < sizes[1]  # the size grows with the sequence's cells
    backend.seq_rm(1, 3, -1)
    assert backend.state_seq_size(1) == len(backend.state_seq_get(1)) == sizes[0]


def test_state_set_rejects_garbage_and_leaves_the_sequence_empty(backend):
    decode(backend, Segment(1, 0, [1, 2], True))
    assert backend.state_seq_set(1, b"not a state") is False
    assert backend.seq_pos_max(1) == -1


def test_sampler_is_deterministic_per_seed_and_closable(backend):
    decode(backend, Segment(0, 0, [1, 2, 3], True))
    a = backend.new_sampler(SamplingParams(seed=1))
    assert isinstance(a, Sampler)
    t = a.sample(2)
    assert t == backend.new_sampler(SamplingParams(seed=1)).sample(2)
    assert len(a.top_logprobs(2, 3)) == 3
    a.close()
    a.close()


def test_bad_grammar_raises_grammar_error(backend):
    with pytest.raises(GrammarError):
        backend.new_sampler(SamplingParams(grammar="this is not gbnf"))
    backend.new_sampler(SamplingParams(grammar='root ::= "a"'))


def test_pieces_and_eog(backend):
    eog = [t for t in range(backend.n_vocab) if backend.is_eog(t)]
    assert eog and all(backend.token_to_piece(t) == b"" for t in eog)
    assert all(isinstance(backend.token_to_piece(t), bytes) for t in range(backend.n_vocab))


# --- fake-specific -----------------------------------------------------------------------------


def test_split_cache_is_per_sequence():
    backend = FakeBackend(n_ctx=8, n_seq_max=2, n_batch=8, kv_unified=False)
    assert backend.n_ctx_seq == 4
    decode(backend, Segment(0, 0, [1] * 4, True))
    with pytest.raises(KVCacheFullError):
        decode(backend, Segment(0, 4, [1], True))
    decode(backend, Segment(1, 0, [1] * 4, True))


def test_no_partial_removal_on_recurrent_backends():
    backend = FakeBackend(n_ctx=16, n_seq_max=1, supports_partial_removal=False)
    decode(backend, Segment(0, 0, [1, 2, 3], True))
    assert backend.seq_rm(0, 1, -1) is False and backend.seq_pos_max(0) == 2
    assert backend.seq_rm(0, 0, -1) and backend.seq_pos_max(0) == -1


def test_reading_cells_of_another_tag_is_recorded():
    backend = FakeBackend(n_ctx=16, n_seq_max=2)
    decode(backend, Segment(0, 0, [1, 2], True, tag=("a", "")))
    backend.seq_cp(0, 1, 0, 2)
    decode(backend, Segment(1, 2, [3], True, tag=("b", "")))
    with pytest.raises(AssertionError, match="attends to cells"):
        backend.check_integrity()


def test_state_size_does_not_serialise_and_counts_the_json_body():
    backend = FakeBackend(n_ctx=16, n_seq_max=2, state_bytes_per_token=1)  # body > padding
    decode(backend, Segment(0, 0, [1, 2, 3], True, tag=("a long cache scope", "id")))
    size = backend.state_seq_size(0)
    assert backend.num_state_gets == 0
    assert size == len(backend.state_seq_get(0)) > 3 and backend.num_state_gets == 1


def test_faults_fire_on_the_chosen_call():
    backend = FakeBackend(n_ctx=16, n_seq_max=1)
    backend.inject("kv_full", at_call=2)
    decode(backend, Segment(0, 0, [1], True))
    with pytest.raises(KVCacheFullError):
        decode(backend, Segment(0, 1, [1], True))
    decode(backend, Segment(0, 1, [1], True))
    backend.check_integrity()


def test_cost_model_advances_the_sim_clock():
    from llamapy.engine import CostModel

    backend = FakeBackend(n_ctx=16, n_seq_max=1, cost=CostModel(step_s=0.01, token_s=0.001))
    decode(backend, Segment(0, 0, [1] * 10, True))
    assert backend.clock.now() == pytest.approx(0.02)


def media_chunk(backend, n_rows: int = 8):
    """A chunk of ``n_rows`` rows as wide as the backend's media rows (the fake projector's
    own rows on the fake backend, zeros on a real one)."""
    from llamapy.engine.fake.media import FAKE_MEDIA_WIDTH, fake_media_rows
    from llamapy.engine.media import MediaChunk

    digest = bytes(range(32))
    width = backend.media_width
    rows = fake_media_rows(digest, 0, n_rows) if width == FAKE_MEDIA_WIDTH \
        else bytes(n_rows * width * 4)
    return MediaChunk(digest, rows, n_rows, width)


def test_media_rows_decode_and_a_failed_plan_leaves_none(backend):
    from llamapy.engine.media import MediaRows

    chunk = media_chunk(backend)
    decode(backend, Segment(0, 0, chunk.token_ids, media=MediaRows(chunk, 0)),
           Segment(1, 0, [1, 2, 3], True))
    assert backend.seq_pos_max(0) == 7 and backend.seq_pos_max(1) == 2
    backend.clear()
    at = 0
    while at < backend.n_ctx - 12:  # all but 12 cells
        n = min(32, backend.n_ctx - 12 - at)
        decode(backend, Segment(2, at, [1] * n, False))
        at += n
    with pytest.raises(KVCacheFullError):  # 8 media rows fit, the 8 tokens after them do not
        decode(backend, Segment(0, 0, chunk.token_ids, media=MediaRows(chunk, 0)),
               Segment(1, 0, [1] * 8, True))
    assert backend.seq_pos_max(0) == -1 and backend.seq_pos_max(1) == -1
