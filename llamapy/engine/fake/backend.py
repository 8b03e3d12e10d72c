"""``FakeBackend``: a pure-Python :class:`~llamapy.engine.backend.Backend` for tests and
simulation (like httpcore's mock backend).

- A pool of ``n_ctx`` simulated KV cells. Each records its position, token, the hash of the
  history up to it, the ``tag`` (cache key) of the request that wrote it, the adapter set it was
  computed under, and the set of sequences sharing it (``seq_cp`` is metadata-only, as in
  llama.cpp's unified cache). With ``kv_unified=False`` the pool is split into ``n_seq_max``
  streams of ``n_ctx // n_seq_max``.
- ``decode`` applies ``plan.adapter_set`` (counting switches), validates the batch like
  llama.cpp (consecutive positions, ``n_batch``), raises ``KVCacheFullError`` (changing nothing)
  when a stream lacks free cells, and records a violation when a segment attends to a cell
  written under another tag or computed under another adapter set.
- Next tokens come from :class:`~llamapy.engine.fake.model.FakeModel`, a pure function of the
  history hash stored in the KV cells (salted by each cell's adapter set) and the seed: wrong
  reuse or wrong batching across adapter sets changes the output.
- Media segments (:mod:`llamapy.engine.media`): their ids must be their chunk's media token ids
  and their rows the chunk's embeddings at those ids (checked against
  :func:`~llamapy.engine.fake.media.fake_media_rows` for fake chunks); a media segment asking
  for logits is a violation. Media rows hash into the history like tokens.
- Pooling (``pools=True``, as a reranker's context): every segment must be a whole sequence
  with every row an output (a violation otherwise), and :meth:`FakeBackend.pooled` gives
  :func:`~llamapy.engine.fake.model.fake_pooled` of its history: output that changes with
  any token, its order or a reuse it should not have had. ``memoryless=True`` keeps no KV
  after a decode (an encoder-only model: its sequences always read as empty).
- Fault switches (:meth:`inject`), a cost model advancing a :class:`SimClock`, and
  :meth:`check_integrity`.
- An asynchronous device (``device``, :mod:`llamapy.engine.fake.device`): ``decode`` queues
  the step and returns; reading its outputs waits for it, as on a GPU.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from llamapy.engine.backend import BatchPlan, Segment
from llamapy.engine.fake.device import Device, DeviceCost
from llamapy.engine.fake.kv import Cell, decode_cells, encode_cells, encoded_size
from llamapy.engine.fake.media import FAKE_MEDIA_WIDTH, media_segment_ok
from llamapy.engine.fake.model import (
    ROOT_HASH,
    CostModel,
    FakeModel,
    SimClock,
    adapter_salt,
    chain_hash,
    fake_pooled,
)
from llamapy.engine.fake.recurrent import RecurrentStates
from llamapy.engine.fake.sampler import FakeSampler
from llamapy.engine.options import SamplingParams
from llamapy.errors import (
    DecodeAbortedError,
    DecodeError,
    GrammarError,
    InvalidBatchError,
    KVCacheFullError,
)

__all__ = ["Cell", "DeviceCost", "FakeBackend", "FakeSampler", "Fault"]

_DECODE_FAULTS = {"decode_error", "abort", "invalid_batch", "kv_full", "slow"}
_FAULT_KINDS = _DECODE_FAULTS | {"restore_fail", "sample_error"}


@dataclass(slots=True)
class Fault:
    """A pending fault: ``kind`` fires on decode call ``at_call`` (any call if None)."""

    kind: str
    at_call: int | None = None
    times: int = 1
    seconds: float = 0.0


def _check_sizes(n_ctx: int, n_seq_max: int, n_batch: int, kv_unified: bool, pools: bool,
                 memoryless: bool) -> None:
    if n_seq_max < 1 or n_ctx < n_seq_max or n_batch < 1:
        raise ValueError("FakeBackend needs n_ctx >= n_seq_max >= 1 and n_batch >= 1")
    if memoryless and (not pools or not kv_unified or n_ctx < n_batch):
        raise ValueError("a memoryless FakeBackend pools, on one cell pool of at least "
                         "n_batch cells (a batch's, freed after it)")


class FakeBackend:
    """See the module docstring. ``sleep_s`` really sleeps per decode (for threaded tests);
    the cost model only advances ``clock``. ``adapter_set`` is the set applied by the last
    ``decode``."""

    def __init__(self, *, n_ctx: int = 4096, n_seq_max: int = 4, n_batch: int = 2048,
                 kv_unified: bool = True, supports_partial_removal: bool = True,
                 model: FakeModel | None = None, cost: CostModel | None = None,
                 clock: SimClock | None = None, state_bytes_per_token: int = 64,
                 sleep_s: float = 0.0, record_plans: bool = False, pools: bool = False,
                 memoryless: bool = False, n_ubatch: int | None = None,
                 device: DeviceCost | None = None) -> None:
        _check_sizes(n_ctx, n_seq_max, n_batch, kv_unified, pools, memoryless)
        self.model = model or FakeModel()
        self.cost = cost or CostModel()
        self.clock = clock or SimClock()
        self._n_ctx, self._n_seq_max, self._n_batch = n_ctx, n_seq_max, n_batch
        self._kv_unified, self._partial = kv_unified, supports_partial_removal
        self.state_bytes_per_token = state_bytes_per_token
        self._pools, self.memoryless = pools, memoryless
        self._n_ubatch = n_batch if n_ubatch is None else n_ubatch
        self._pooled: dict[int, int] = {}
        self.sleep_s = sleep_s
        self.device = Device(device) if device is not None else None
        self.record_plans = record_plans
        self.plans: list[BatchPlan] = []
        self.faults: list[Fault] = []
        self.violations: list[str] = []
        self.open_samplers: set[FakeSampler] = set()
        self.num_decode_calls = 0
        self.num_decoded_tokens = 0
        self.adapter_set: Hashable = ()
        self.num_adapter_switches = 0
        self.num_state_gets = 0
        self._cells: list[Cell | None] = [None] * n_ctx
        n_streams = 1 if kv_unified else n_seq_max
        size = n_ctx // n_streams
        self._free = [list(range(s * size, (s + 1) * size))[::-1] for s in range(n_streams)]
        self._seq: list[dict[int, int]] = [{} for _ in range(n_seq_max)]
        self._pos_max: list[int | None] = [-1] * n_seq_max  # (None: unknown, see seq_pos_max)
        self._marks: list[Counter[tuple[Hashable, Hashable]]] = \
            [Counter() for _ in range(n_seq_max)]
        self._rows: dict[int, int] = {}
        self.recurrent = RecurrentStates(n_seq_max, 16 * state_bytes_per_token)

    # --- Backend properties ------------------------------------------------------------------

    n_ctx = property(lambda self: self._n_ctx, doc="Total KV cells.")
    n_seq_max = property(lambda self: self._n_seq_max, doc="Number of sequences.")
    n_batch = property(lambda self: self._n_batch, doc="Max tokens per decode.")
    n_ubatch = property(lambda self: self._n_ubatch, doc="Rows of a physical batch.")
    media_width = property(lambda self: FAKE_MEDIA_WIDTH, doc="Floats in a fake media row.")
    kv_unified = property(lambda self: self._kv_unified, doc="One shared cell pool.")
    pools = property(lambda self: self._pools, doc="Whether sequences are pooled.")
    supports_partial_removal = property(lambda self: self._partial, doc="False: recurrent.")
    n_vocab = property(lambda self: self.model.n_vocab, doc="Vocabulary size.")
    async_decode = property(lambda self: self.device is not None,
                            doc="Whether decode only queues the step (the async device).")

    @property
    def n_ctx_seq(self) -> int:
        """Per-sequence limit."""
        return self._n_ctx if self._kv_unified else self._n_ctx // self._n_seq_max

    @property
    def num_cells_used(self) -> int:
        """Cells holding at least one sequence."""
        return sum(c is not None for c in self._cells)

    # --- faults --------------------------------------------------------------------------------

    def inject(self, kind: str, *, at_call: int | None = None, times: int = 1,
               seconds: float = 0.0) -> None:
        """Arm a fault: ``decode_error``, ``abort``, ``invalid_batch``, ``kv_full``, ``slow``
        (adds ``seconds`` of simulated time) on decode call ``at_call`` (1-based; None = the
        next call), ``restore_fail`` (the next ``state_seq_set`` fails) or ``sample_error``
        (the next ``Sampler.sample`` raises ``GrammarError``)."""
        if kind not in _FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}; valid: {sorted(_FAULT_KINDS)}")
        self.faults.append(Fault(kind, at_call, times, seconds))

    def _take_fault(self, kinds: set[str], call: int | None) -> Fault | None:
        for fault in self.faults:
            if fault.kind in kinds and (fault.at_call is None or fault.at_call == call):
                fault.times -= 1
                if fault.times <= 0:
                    self.faults.remove(fault)
                return fault
        return None

    # --- decode --------------------------------------------------------------------------------

    def decode(self, plan: BatchPlan) -> None:
        """See :meth:`Backend.decode`."""
        entered = time.perf_counter()  # (a device step starts here: .device)
        self.num_decode_calls += 1
        if self.sleep_s:
            time.sleep(self.sleep_s)
        self._validate(plan)
        self._pooled = {}
        if plan.adapter_set != self.adapter_set:
            self.adapter_set = plan.adapter_set
            self.num_adapter_switches += 1
        fault = self._take_fault(_DECODE_FAULTS, self.num_decode_calls)
        if fault is not None and fault.kind == "slow":
            self.clock.advance(fault.seconds)
            fault = None
        if fault is not None and fault.kind == "kv_full":
            raise KVCacheFullError()
        if not self.memoryless:
            self._check_room(plan)
        if fault is not None:  # llama.cpp keeps what earlier ubatches wrote: write segment 0
            self._write(plan.segments[0], 0)
            raise {"abort": DecodeAbortedError, "invalid_batch": InvalidBatchError}.get(
                fault.kind, lambda: DecodeError(-3, "injected decode failure"))()
        self._rows = {}
        read = 0
        for seg, off in zip(plan.segments, plan.offsets, strict=True):
            self._write(seg, off)
            read += seg.start_pos + len(seg.token_ids) if seg.logits else 0
        if self._pools:
            self._pool(plan)
        self.num_decoded_tokens += plan.n_tokens
        self.clock.advance(self.cost.decode_time(plan.n_tokens, read))
        if self.device is not None:
            self.device.queue(plan.n_tokens, read, entered)
        if self.record_plans:
            self.plans.append(plan)

    def _pool(self, plan: BatchPlan) -> None:
        """Keep each pooled sequence's history hash (a violation for one that is not whole,
        all rows outputs, or in a batch past one physical batch); a memoryless backend then
        forgets the batch's KV."""
        if plan.n_tokens > self._n_ubatch:
            self.violations.append(f"a pooled batch of {plan.n_tokens} tokens, past one "
                                   f"physical batch ({self._n_ubatch})")
        for seg, off in zip(plan.segments, plan.offsets, strict=True):
            if seg.start_pos != 0 or not seg.logits or seg.n_outputs != len(seg.token_ids):
                self.violations.append(f"seq {seg.seq_id}: a pooled segment that is not the "
                                       "whole sequence with every row an output")
            self._pooled[seg.seq_id] = self._rows[off + len(seg.token_ids) - 1]
            if self.memoryless:
                self.seq_rm(seg.seq_id, 0, -1)

    def pooled(self, seq_id: int) -> tuple[float, ...]:
        """The pooled output of ``seq_id`` from the last decode (see the module docstring)."""
        if seq_id not in self._pooled:
            raise IndexError(f"the last decode pooled no sequence {seq_id}")
        self.wait_outputs()
        return fake_pooled(self._pooled[seq_id])

    def output_row(self, batch_index: int) -> int:
        """History hash at output row ``batch_index`` of the last decode."""
        if batch_index not in self._rows:
            raise IndexError(f"no logits at batch index {batch_index}")
        self.wait_outputs()
        return self._rows[batch_index]

    def wait_outputs(self) -> None:
        """Block until the last decode's outputs are readable (at once off the device)."""
        if self.device is not None:
            self.device.wait()

    def logits(self, batch_index: int) -> list[float]:
        """Raw logits of output row ``batch_index`` (see :meth:`FakeModel.logits`)."""
        return self.model.logits(self.output_row(batch_index))

    def _validate(self, plan: BatchPlan) -> None:
        seqs = [s.seq_id for s in plan.segments]
        ok = plan.n_tokens > 0 and max(plan.decodes()) <= self._n_batch
        ok = ok and len(set(seqs)) == len(seqs)
        for seg in plan.segments:
            ok = ok and 0 <= seg.seq_id < self._n_seq_max and len(seg.token_ids) > 0
            ok = ok and seg.start_pos == self.seq_pos_max(seg.seq_id) + 1
            ok = ok and (all(0 <= t < self.model.n_vocab for t in seg.token_ids)
                         if seg.media is None else media_segment_ok(seg, self.violations))
        if not ok:
            raise InvalidBatchError()

    def _stream(self, seq_id: int) -> int:
        return 0 if self._kv_unified else seq_id

    def _check_room(self, plan: BatchPlan) -> None:
        need: Counter[int] = Counter()
        for seg in plan.segments:
            need[self._stream(seg.seq_id)] += len(seg.token_ids)
        if any(len(self._free[s]) < n for s, n in need.items()):
            raise KVCacheFullError()

    def _write(self, seg: Segment, offset: int) -> None:
        seq, pos, adapters = seg.seq_id, seg.start_pos, self.adapter_set
        tags, sets = self.seq_tags(seq), self.seq_adapter_sets(seq)
        if tags - {seg.tag}:
            self.violations.append(f"seq {seq} (tag {seg.tag!r}) attends to cells of {tags}")
        if sets - {adapters}:
            self.violations.append(f"seq {seq} decoded under adapter set {adapters!r} attends "
                                   f"to cells computed under {sets}")
        if seg.draft_tag is not None and seg.draft_tag != seg.tag:
            self.violations.append(f"seq {seq} (tag {seg.tag!r}) verifies a draft proposed "
                                   f"from {seg.draft_tag!r}")
        h = self._cell(self._seq[seq][pos - 1]).hash if pos > 0 else ROOT_HASH
        if not self._partial:  # a recurrent model continues from its state, not the cells
            h = self.recurrent.start(seq, pos, seg.tag, adapters, h, self.violations)
        salt = adapter_salt(adapters)
        n = len(seg.token_ids)
        first_out = n - max(1, seg.n_outputs) if seg.logits else n
        for i, token in enumerate(seg.token_ids):
            h = chain_hash(h, token, salt)
            cell = Cell(pos + i, token, h, seg.tag, adapters)
            self._new_cell(seq, cell)
            if i >= first_out:
                self._rows[offset + i] = h
        self.recurrent.advance(seq, cell)

    def _cell(self, index: int) -> Cell:
        cell = self._cells[index]
        assert cell is not None, "fake backend: dangling cell index"
        return cell

    def _new_cell(self, seq: int, cell: Cell) -> None:
        index = self._free[self._stream(seq)].pop()
        cell.seqs.add(seq)
        self._cells[index] = cell
        self._seq[seq][cell.pos] = index
        known = self._pos_max[seq]
        if known is not None:
            self._pos_max[seq] = max(known, cell.pos)
        self._marks[seq][cell.mark] += 1

    def _unlink(self, seq: int, pos: int) -> None:
        index = self._seq[seq].pop(pos)
        self._pos_max[seq] = None
        cell = self._cell(index)
        cell.seqs.discard(seq)
        self._marks[seq][cell.mark] -= 1
        if not self._marks[seq][cell.mark]:
            del self._marks[seq][cell.mark]
        if not cell.seqs:
            self._cells[index] = None
            self._free[self._stream(seq)].append(index)

    # --- sampling and vocabulary -------------------------------------------------------------

    def load_adapters(self, adapter_set: Hashable) -> None:
        """Any hashable set is usable (adapter sets only salt the fake model)."""
        hash(adapter_set)

    def new_sampler(self, params: SamplingParams) -> FakeSampler:
        """A :class:`FakeSampler`; a grammar must define its root rule (``root ::= ...``)."""
        if params.grammar and f"{params.grammar_root} ::=" not in params.grammar:
            raise GrammarError(f"grammar does not define rule {params.grammar_root!r}")
        sampler = FakeSampler(self, params)
        self.open_samplers.add(sampler)
        return sampler

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """The token's bytes (b"" for the EOG token; the fake has no other special token)."""
        return self.model.pieces[token_id]

    def is_eog(self, token_id: int) -> bool:
        """True for the model's EOG token."""
        return token_id == self.model.eog_token

    # --- KV ops --------------------------------------------------------------------------------

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position of ``seq_id`` or -1 (kept as cells are added; found again after
        a removal)."""
        known = self._pos_max[seq_id]
        if known is None:
            known = self._pos_max[seq_id] = max(self._seq[seq_id], default=-1)
        return known

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        """Remove ``[p0, p1)``; without partial removal only all of a sequence, or positions
        past its recurrent state (:mod:`~llamapy.engine.fake.recurrent`)."""
        p0 = max(p0, 0)
        hit = [p for p in self._seq[seq_id] if p >= p0 and (p1 < 0 or p < p1)]
        whole = len(hit) == len(self._seq[seq_id])
        if hit and not (self._partial or whole or self.recurrent.can_remove(seq_id, p0)):
            return False
        for pos in hit:
            self._unlink(seq_id, pos)
        if not self._seq[seq_id]:
            self.recurrent.reset(seq_id)
        return True

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Share ``src``'s cells in ``[p0, p1)`` with ``dst`` (same stream only)."""
        if self._stream(src) != self._stream(dst):
            raise ValueError("seq_cp across streams needs kv_unified")
        for pos, index in sorted(self._seq[src].items()):
            if pos >= max(p0, 0) and (p1 < 0 or pos < p1):
                if pos in self._seq[dst]:
                    raise ValueError(f"seq_cp: seq {dst} already has position {pos}")
                cell = self._cell(index)
                cell.seqs.add(dst)
                self._seq[dst][pos] = index
                known = self._pos_max[dst]
                if known is not None:
                    self._pos_max[dst] = max(known, pos)
                self._marks[dst][cell.mark] += 1
        self.recurrent.copy(src, dst, p1)

    def seq_keep(self, seq_id: int) -> None:
        """Remove every other sequence."""
        for seq in range(self._n_seq_max):
            if seq != seq_id:
                self.seq_rm(seq, 0, -1)

    def clear(self) -> None:
        """Remove everything."""
        for seq in range(self._n_seq_max):
            for pos in list(self._seq[seq]):
                self._unlink(seq, pos)
            self.recurrent.reset(seq)

    # --- state ---------------------------------------------------------------------------------

    def state_seq_get(self, seq_id: int, partial: bool = False) -> bytes:
        """Serialise ``seq_id`` (padded to ``state_bytes_per_token`` per cell; ``partial``:
        its recurrent state alone, 16 tokens' worth); counted in ``num_state_gets``."""
        self.num_state_gets += 1
        if partial:
            return self.recurrent.encode(seq_id)
        return encode_cells(self._seq_cells(seq_id), self.state_bytes_per_token)

    def state_seq_size(self, seq_id: int, partial: bool = False) -> int:
        """``len(state_seq_get(seq_id, partial))``, without serialising (not counted)."""
        if partial:
            return self.recurrent.size(seq_id)
        return encoded_size(self._seq_cells(seq_id), self.state_bytes_per_token)

    def state_seq_set(self, seq_id: int, data: bytes, partial: bool = False) -> bool:
        """Replace ``seq_id`` with ``data`` (``partial``: its recurrent state only); False
        (sequence left empty) on any failure."""
        if not partial:
            self.seq_rm(seq_id, 0, -1)
        self.clock.advance(self.cost.restore_byte_s * len(data))
        failed = self._take_fault({"restore_fail"}, None) is not None
        if partial:
            state = None if failed else self.recurrent.decode(data)
            if state is None:
                self.seq_rm(seq_id, 0, -1)
                return False
            self.recurrent.put(seq_id, state)
            return True
        cells = None if failed else decode_cells(data)
        if cells is None or len(cells) > len(self._free[self._stream(seq_id)]):
            return False
        for cell in cells:
            self._new_cell(seq_id, cell)
        if cells:
            self.recurrent.advance(seq_id, cells[-1])
        return True

    def _seq_cells(self, seq_id: int) -> list[Cell]:
        return [self._cell(i) for _, i in sorted(self._seq[seq_id].items())]

    # --- inspection ----------------------------------------------------------------------------

    def seq_tokens(self, seq_id: int) -> list[int]:
        """Tokens of ``seq_id`` by position."""
        return [self._cell(i).token for _, i in sorted(self._seq[seq_id].items())]

    def seq_tags(self, seq_id: int) -> set[Hashable]:
        """Tags of the cells ``seq_id`` attends to."""
        return {tag for tag, _ in self._marks[seq_id]}

    def seq_adapter_sets(self, seq_id: int) -> set[Hashable]:
        """Adapter sets the cells ``seq_id`` attends to were computed under."""
        return {adapters for _, adapters in self._marks[seq_id]}

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` on broken bookkeeping or a cross-tag read."""
        if self.violations:
            raise AssertionError(f"fake backend: {self.violations[0]}")
        free = {i for stream in self._free for i in stream}
        for index, cell in enumerate(self._cells):
            if (cell is None) != (index in free):
                raise AssertionError(f"fake backend: cell {index} free-list mismatch")
            if cell is not None and not cell.seqs:
                raise AssertionError(f"fake backend: cell {index} has no sequence")
        for seq, cells in enumerate(self._seq):
            if sorted(cells) != list(range(len(cells))):
                raise AssertionError(f"fake backend: seq {seq} positions not 0..n-1")
            marks = Counter(self._cell(i).mark for i in cells.values())
            if marks != self._marks[seq]:
                raise AssertionError(f"fake backend: seq {seq} tag counts drifted")
            if not self._partial and self.recurrent.of(seq).pos != len(cells) - 1:
                raise AssertionError(f"fake backend: seq {seq}'s recurrent state is not at "
                                     "its last position")

