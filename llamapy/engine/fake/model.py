"""The fake backend's "model": deterministic next tokens, pieces, the reference oracle.

The next token is a pure function of (the full token history, the adapter set each cell was
computed under, the sampling seed): the history enters through a hash chained cell by cell, each
link salted by its cell's adapter set (the base model, ``()``, adds no salt), so a wrong KV reuse
or a cell computed under the wrong adapter set changes every later token. :func:`reference`
computes what a request must produce with no batching, chunking or reuse.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from llamapy.engine.options import SamplingParams

__all__ = ["N_BYTE_TOKENS", "ROOT_HASH", "CostModel", "FakeModel", "SimClock", "adapter_salt",
           "chain_hash", "fake_pooled", "pooled_history", "reference"]

_MASK = (1 << 64) - 1
ROOT_HASH = 0x6A09E667F3BCC908
#: Byte tokens a ``FakeModel(byte_tokens=True)`` ends its vocabulary with (one per byte value).
N_BYTE_TOKENS = 256


def _mix(x: int) -> int:
    """splitmix64 finaliser."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def chain_hash(prev: int, token: int, salt: int = 0) -> int:
    """Hash of a history extended by ``token`` computed under the adapter set with ``salt``."""
    return _mix(prev ^ ((token + 1) * 0x100000001B3 & _MASK) ^ salt)


def fake_pooled(history: int) -> tuple[float, ...]:
    """A fake pooled output (one score, as a reranker's) of the history hash ``history``."""
    return ((history % 1_000_003) / 1000.0 - 500.0,)


def pooled_history(token_ids: Sequence[int]) -> int:
    """The history hash a base-model sequence of ``token_ids`` ends with (from position 0)."""
    h = ROOT_HASH
    for token in token_ids:
        h = chain_hash(h, token)
    return h


def adapter_salt(adapter_set: Hashable) -> int:
    """A stable 64-bit salt for an adapter set; 0 for the base model (``()``)."""
    if adapter_set == ():
        return 0
    digest = hashlib.blake2b(repr(adapter_set).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") | 1


def _piece(token: int) -> bytes:
    if token % 13 == 1:
        return b"\xe2\x82"  # first two bytes of the euro sign: needs the next token
    if token % 13 == 2:
        return b"\xac"
    if token % 17 == 3:
        return b"\n"
    if token % 11 == 5:
        return " é".encode()
    return f" w{token}".encode()


@dataclass(slots=True, frozen=True)
class FakeModel:
    """Vocabulary and next-token function of the fake backend.

    Token ``eog_token`` is the only end-of-generation token; it is drawn with probability
    ``eog_permille / 1000`` per step. Tokens with a ``logit_bias`` of ``-inf`` (or <= -100)
    are never drawn. ``temp <= 0`` (greedy) draws with seed 0.

    With ``byte_tokens`` the vocabulary ends with :data:`N_BYTE_TOKENS` tokens whose pieces are
    the single bytes 0..255 (what a byte tokenizer maps text to, see
    :class:`~llamapy.engine.fake.text.FakeTextModel`); generation draws only from the
    :attr:`n_words` tokens before them.
    """

    n_vocab: int = 64
    eog_token: int = 0
    eog_permille: int = 60
    byte_tokens: bool = False
    pieces: tuple[bytes, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if self.n_words < 3 or not 0 <= self.eog_token < self.n_words:
            raise ValueError("FakeModel needs n_vocab >= 3 (past its byte tokens) and the EOG "
                             "token among them")
        pieces = [b"" if t == self.eog_token else _piece(t) for t in range(self.n_words)]
        if self.byte_tokens:
            pieces += [bytes([b]) for b in range(N_BYTE_TOKENS)]
        object.__setattr__(self, "pieces", tuple(pieces))

    @property
    def n_words(self) -> int:
        """The tokens generation draws from: the vocabulary less its byte tokens."""
        return self.n_vocab - N_BYTE_TOKENS if self.byte_tokens else self.n_vocab

    def history_hash(self, token_ids: Sequence[int], adapter_set: Hashable = ()) -> int:
        """Hash of a whole history computed under ``adapter_set``."""
        h, salt = ROOT_HASH, adapter_salt(adapter_set)
        for t in token_ids:
            h = chain_hash(h, t, salt)
        return h

    def next_token(self, history: int, params: SamplingParams) -> int:
        """The token drawn after a history with hash ``history``."""
        seed = 0 if params.temp <= 0 else params.native_seed
        u = _mix(history ^ _mix(seed + 1))
        banned = _banned(params)
        if u % 1000 < self.eog_permille and self.eog_token not in banned:
            return self.eog_token
        n_other = self.n_words - 1
        for step in range(n_other):
            token = 1 + ((u >> 10) + step) % n_other
            token = token if token != self.eog_token else 0
            if token not in banned:
                return token
        return self.eog_token

    def top_logprobs(self, history: int, n: int) -> list[tuple[int, float]]:
        """A deterministic top-``n`` list for a history (at most the vocabulary, as a real
        model's)."""
        u = _mix(history ^ 0x5851F42D4C957F2D)
        picks = [(u >> (4 * i)) % self.n_vocab for i in range(min(n, self.n_vocab))]
        return [(t, -0.25 * (i + 1)) for i, t in enumerate(picks)]

    def logits(self, history: int) -> list[float]:
        """Deterministic raw logits after a history: values in ``[-4, 0)``, with the greedy
        next token (``next_token`` at ``temp=0``) raised to ``+1`` so it is the argmax."""
        u = _mix(history ^ 0x2545F4914F6CDD1D)
        out = [-4.0 + ((u >> (t % 48)) % 997) / 250.0 for t in range(self.n_vocab)]
        out[self.next_token(history, _GREEDY)] = 1.0
        return out

    def reference(self, prompt: Sequence[int], max_tokens: int, params: SamplingParams,
                  adapter_set: Hashable = ()) -> list[int]:
        """The tokens a request must produce under ``adapter_set``: up to ``max_tokens``,
        ending at EOG inclusive."""
        h, salt = self.history_hash(prompt, adapter_set), adapter_salt(adapter_set)
        out: list[int] = []
        while len(out) < max_tokens:
            token = self.next_token(h, params)
            out.append(token)
            if token == self.eog_token:
                break
            h = chain_hash(h, token, salt)
        return out


_GREEDY = SamplingParams(temp=0.0)


def _banned(params: SamplingParams) -> frozenset[int]:
    if not params.logit_bias:
        return frozenset()
    return frozenset(t for t, b in params.logit_bias.items() if b <= -100 or math.isinf(b))


def reference(prompt: Sequence[int], max_tokens: int, seed: int, *, temp: float = 0.8,
              model: FakeModel | None = None, adapter_set: Hashable = ()) -> list[int]:
    """The oracle: the correct output of ``prompt`` under ``adapter_set`` on the fake model,
    computed token by token with no batching, chunking or reuse."""
    params = SamplingParams(seed=seed, temp=temp)
    return (model or FakeModel()).reference(prompt, max_tokens, params, adapter_set)


@dataclass(slots=True)
class SimClock:
    """A simulated clock the fake backend advances by its cost model."""

    t: float = 0.0

    def now(self) -> float:
        """Current simulated time in seconds."""
        return self.t

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.t += max(0.0, seconds)


@dataclass(slots=True, frozen=True)
class CostModel:
    """Simulated time of backend work.

    One ``decode`` costs ``step_s`` (weights read once per pass) plus ``token_s`` per batch
    token plus ``ctx_token_s`` per KV cell attended by the batch's output rows; restoring state
    costs ``restore_byte_s`` per byte.
    """

    step_s: float = 0.0
    token_s: float = 0.0
    ctx_token_s: float = 0.0
    restore_byte_s: float = 0.0

    def decode_time(self, n_tokens: int, n_ctx_read: int = 0) -> float:
        """Seconds one decode of ``n_tokens`` takes."""
        return self.step_s + self.token_s * n_tokens + self.ctx_token_s * n_ctx_read
