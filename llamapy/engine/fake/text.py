"""``FakeTextModel``: the fake backend's model as the API layers see a loaded model.

The routes and the API adapters ask a model for its tokenizer, its token pieces, its special
tokens, its chat template and its metadata. This class answers them for a
:class:`~llamapy.engine.fake.model.FakeModel` with byte tokens, so that a
:class:`~llamapy.server.Server` on the fake backend (:func:`llamapy.server.fake.fake_server`)
serves the whole HTTP app without libllama:

- Text is tokenized byte by byte (UTF-8); with ``parse_special``, :data:`END_OF_TURN` becomes
  the end-of-generation token. ``detokenize(tokenize(text)) == text`` for every text.
- Each token's piece is the fake backend's (:meth:`FakeBackend.token_to_piece`), so a
  response's text is its generated tokens detokenized; with ``special`` the end-of-generation
  token renders as :data:`END_OF_TURN`.
- No BOS, no fill-in-the-middle tokens (``/infill`` is then refused, as for such a model);
  the built-in chat template is ChatML.

Token ids outside the vocabulary raise ``IndexError`` (the native model must never see one:
the API validates ids first, and a test that reaches this is a missing check).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llamapy.engine.fake.model import N_BYTE_TOKENS, FakeModel

__all__ = ["CHAT_TEMPLATE", "END_OF_TURN", "FakeTextModel"]

#: The end-of-generation token's text (ChatML's end of turn).
END_OF_TURN = "<|im_end|>"

#: The built-in chat template (ChatML, as the GGUF's ``tokenizer.chat_template``).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_FIM_ROLES = ("pre", "suf", "mid", "pad", "rep", "sep")


class FakeTextModel:
    """A loaded model's interface over a byte-token :class:`FakeModel` (see the module).

    ``n_words``: the tokens generation draws from (the vocabulary is those plus 256 byte
    tokens); ``eog_permille``: the chance per token of ending (see :class:`FakeModel`).
    """

    n_embd = 64
    n_ctx_train = 4096
    is_recurrent = False
    closed = False

    def __init__(self, path: str = "fake.gguf", *, n_words: int = 64,
                 eog_permille: int = 60) -> None:
        self.path = Path(path)
        self.fake = FakeModel(n_vocab=n_words + N_BYTE_TOKENS, eog_permille=eog_permille,
                              byte_tokens=True)

    # --- metadata -------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        """Vocabulary size (words, the end-of-generation token and 256 bytes)."""
        return self.fake.n_vocab

    @property
    def description(self) -> str:
        """A one-line description, as llama.cpp gives one."""
        return f"fake {self.n_vocab}-token byte model"

    @property
    def size(self) -> int:
        """Bytes of the (absent) tensors."""
        return 0

    @property
    def n_params(self) -> int:
        """Parameters (none)."""
        return 0

    def metadata(self) -> dict[str, str]:
        """GGUF-style key/value pairs."""
        return {"general.architecture": "fake", "general.name": self.path.stem,
                "tokenizer.ggml.model": "fake-bytes", "tokenizer.chat_template": CHAT_TEMPLATE}

    def meta(self, key: str) -> str | None:
        """One metadata value, or ``None``."""
        return self.metadata().get(key)

    def chat_template(self, name: str | None = None) -> str | None:
        """The built-in template (ChatML); a named one: ``None``."""
        return CHAT_TEMPLATE if name is None else None

    # --- special tokens -------------------------------------------------------------------

    @property
    def bos(self) -> int:
        """No beginning-of-sequence token."""
        return -1

    @property
    def eos(self) -> int:
        """The end-of-generation token."""
        return self.fake.eog_token

    @property
    def eot(self) -> int:
        """The end-of-generation token."""
        return self.fake.eog_token

    @property
    def add_bos(self) -> bool:
        """Tokenization never prepends BOS."""
        return False

    @property
    def sep(self) -> int:
        """The separator token (the end-of-generation token; no pair template uses it)."""
        return self.fake.eog_token

    add_eos = False
    add_sep = False

    @property
    def fim_tokens(self) -> dict[str, int]:
        """No fill-in-the-middle tokens (-1 for each role)."""
        return dict.fromkeys(_FIM_ROLES, -1)

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation."""
        return token == self.fake.eog_token

    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token."""
        return (self.fake.eog_token,)

    # --- vocabulary -----------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False
                 ) -> list[int]:
        """Text to byte tokens (``parse_special``: :data:`END_OF_TURN` to the EOG token;
        ``add_special`` adds nothing: the model has no BOS)."""
        if not parse_special:
            return self._bytes(text)
        out: list[int] = []
        for i, part in enumerate(text.split(END_OF_TURN)):
            if i:
                out.append(self.fake.eog_token)
            out += self._bytes(part)
        return out

    def _bytes(self, text: str) -> list[int]:
        base = self.fake.n_words
        return [base + b for b in text.encode("utf-8")]

    def token_to_piece(self, token: int, special: bool = True) -> bytes:
        """The bytes of one token (the EOG token: :data:`END_OF_TURN` when ``special``)."""
        self._check(token)
        if token == self.fake.eog_token:
            return END_OF_TURN.encode() if special else b""
        return self.fake.pieces[token]

    def detokenize(self, tokens: Sequence[int], remove_special: bool = False,
                   unparse_special: bool = False) -> str:
        """Token ids to text (invalid UTF-8 replaced)."""
        data = b"".join(self.token_to_piece(t, unparse_special) for t in tokens)
        return data.decode("utf-8", "replace")

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text for a token."""
        return self.token_to_piece(token, True).decode("utf-8", "replace")

    def _check(self, token: int) -> None:
        if not 0 <= token < self.n_vocab:
            raise IndexError(f"token {token} is outside the vocabulary (0..{self.n_vocab - 1})")

    # --- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Nothing to free."""

    def __repr__(self) -> str:
        return f"<FakeTextModel {self.path.name} {self.description}>"
