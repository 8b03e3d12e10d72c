"""What every layer above the engine reads of a loaded model (:class:`ModelInfo`) and of its
media encoder (:class:`MediaEncoding`).

The native model (:class:`llamapy._native.Model`) and the fake backend's text model
(:class:`llamapy.engine.fake.text.FakeTextModel`) both provide the first, the projector's
encoder (:class:`llamapy.media.encoder.MediaEncoder`) and the fake one
(:class:`llamapy.media.fake.FakeMediaEncoder`) the second, and the type checker holds each to
its protocol where a tick thread hosts one (:class:`~llamapy.runtime.hosting.Hosted`), so an app
on the fake backend exercises exactly the surface it serves on a real model. What only a
native model has (its pointers, its vocabulary handle) is reached through the native model
itself, never through this.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from llamapy.engine.media import MediaPrompt
from llamapy.options.limits import RequestLimits

__all__ = ["MediaEncoding", "ModelInfo"]


class ModelInfo(Protocol):
    """A loaded model's metadata, vocabulary and tokenizer (see the module)."""

    @property
    def path(self) -> Path:
        """The model file."""

    @property
    def closed(self) -> bool:
        """Whether the model was closed."""

    @property
    def description(self) -> str:
        """A one-line description (architecture, size, type)."""

    @property
    def size(self) -> int:
        """Bytes of the tensors."""

    @property
    def n_params(self) -> int:
        """Parameters."""

    @property
    def n_vocab(self) -> int:
        """Vocabulary size."""

    @property
    def n_embd(self) -> int:
        """Embedding width."""

    @property
    def n_ctx_train(self) -> int:
        """The context the model was trained on."""

    @property
    def is_recurrent(self) -> bool:
        """Whether its state is recurrent (it cannot be cut back to an earlier position)."""

    @property
    def bos(self) -> int:
        """Beginning-of-sequence token (-1: none)."""

    @property
    def eos(self) -> int:
        """End-of-sequence token (-1: none)."""

    @property
    def eot(self) -> int:
        """End-of-turn token (-1: none)."""

    @property
    def sep(self) -> int:
        """Separator token (-1: none)."""

    @property
    def add_bos(self) -> bool:
        """Whether tokenizing with special tokens prepends ``bos``."""

    @property
    def add_eos(self) -> bool:
        """Whether tokenizing with special tokens appends ``eos``."""

    @property
    def add_sep(self) -> bool:
        """Whether a pair of texts is joined by ``sep`` (rerankers)."""

    @property
    def fim_tokens(self) -> dict[str, int]:
        """The fill-in-the-middle tokens it has, by role (``prefix``, ``suffix``, ...)."""

    def meta(self, key: str) -> str | None:
        """One GGUF metadata value as text (None: absent)."""

    def metadata(self) -> dict[str, str]:
        """Every GGUF metadata value as text."""

    def chat_template(self, name: str | None = None) -> str | None:
        """The chat template stored in the file (``name``: a named one), None without."""

    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token."""

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation."""

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False
                 ) -> list[int]:
        """The tokens of ``text``."""

    def detokenize(self, tokens: Sequence[int], remove_special: bool = False,
                   unparse_special: bool = False) -> str:
        """The text of ``tokens``."""

    def token_to_piece(self, token: int, special: bool = True) -> bytes:
        """The bytes of one token."""

    def token_text(self, token: int) -> str:
        """A token's vocabulary entry as text."""

    def close(self) -> None:
        """Free the model (idempotent)."""


class MediaEncoding(Protocol):
    """A model's media encoder: what it takes, and prompts with media in them."""

    @property
    def modalities(self) -> dict[str, bool]:
        """``{"vision": ..., "audio": ...}``."""

    def prompt(self, text: str, media: Sequence[bytes], limits: RequestLimits, *,
               tenant: str | None = None, add_special: bool = True, parse_special: bool = True,
               max_tokens: int | None = None) -> MediaPrompt:
        """``text`` tokenized with ``media`` in place of its markers, the media encoded."""

    def close(self) -> None:
        """Free the encoder (idempotent)."""
