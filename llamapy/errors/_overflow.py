"""What a context overflow reports: :class:`ContextOverflowDetail`, the value of
:meth:`llamapy.errors.ContextOverflowError.overflow_detail`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ContextOverflowDetail"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextOverflowDetail:
    """The token counts of an overflow at one primitive boundary.

    ``stage`` names the primitive (``"admit"``, ``"prefill"``, ``"decode"``, ``"embed"``,
    ``"ensure_prefix"``, ``"prefill_suffix"``); ``resident_tokens`` were already in the
    sequence, ``additional_tokens`` did not fit, ``n_ctx`` is the limit that applied.
    """

    stage: str
    resident_tokens: int
    additional_tokens: int
    n_ctx: int

    @property
    def n_prompt_tokens(self) -> int:
        """The tokens the request needed in the context (llama-server's count)."""
        return self.resident_tokens + self.additional_tokens

    @property
    def excess_tokens(self) -> int:
        """How many tokens too many: what must go for the request to fit."""
        return max(0, self.n_prompt_tokens - self.n_ctx)

    def as_dict(self) -> dict[str, Any]:
        """The fields an HTTP error body carries: the four counts and ``n_prompt_tokens``."""
        return {"stage": self.stage, "resident_tokens": self.resident_tokens,
                "additional_tokens": self.additional_tokens, "n_ctx": self.n_ctx,
                "n_prompt_tokens": self.n_prompt_tokens}
