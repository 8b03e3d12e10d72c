"""``FakeSampler``: the fake backend's per-request sampler (draws from its ``FakeModel``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamapy.engine.options import SamplingParams
from llamapy.errors import GrammarError

if TYPE_CHECKING:
    from llamapy.engine.fake.backend import FakeBackend

__all__ = ["FakeSampler"]


class FakeSampler:
    """Draws from :class:`FakeModel`; records the tokens it accepted."""

    def __init__(self, backend: FakeBackend, params: SamplingParams) -> None:
        self._backend = backend
        self.params = params
        self.accepted: list[int] = []
        self.closed = False

    def sample(self, batch_index: int) -> int:
        """Draw (and accept) the token of output row ``batch_index``."""
        if self._backend._take_fault({"sample_error"}, None) is not None:
            raise GrammarError("injected: no token satisfies the grammar")
        token = self._backend.model.next_token(self._backend.output_row(batch_index),
                                               self.params)
        self.accepted.append(token)
        return token

    def accept(self, token_id: int) -> None:
        """Record a token not produced by :meth:`sample`."""
        self.accepted.append(token_id)

    def top_logprobs(self, batch_index: int, n: int) -> list[tuple[int, float]]:
        """Deterministic top-``n`` pairs of row ``batch_index``."""
        return self._backend.model.top_logprobs(self._backend.output_row(batch_index), n)

    def token_logprob(self, batch_index: int, token_id: int) -> float:
        """The token's pair in a long deterministic top list, else a low constant."""
        row = self._backend.output_row(batch_index)
        for token, logprob in self._backend.model.top_logprobs(row, 16):
            if token == token_id:
                return logprob
        return -8.0

    def close(self) -> None:
        """Idempotent."""
        if not self.closed:
            self.closed = True
            self._backend.open_samplers.discard(self)
