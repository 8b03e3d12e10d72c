"""``ContextManifest``: the identity that makes reuse of resident KV valid.

Reuse requires compatible *identity*, not equal text (token-level LCP handles text changes).
The identity fields, compared in this order by :meth:`ContextManifest.compare`:

==========================  ===================================================================
``model_digest``            sha256 of the GGUF file (:func:`llamapy.fingerprint.model_fingerprint`)
``tokenizer``               sha256 of the model's ``tokenizer.*`` metadata and vocabulary size
``chat_template_digest``    sha256 of the chat template the caller renders with
``runtime_digest``          sha256 of n_ctx, KV types, flash attention, RoPE/YaRN settings and
                            the library version (``runtime`` holds the readable values)
``bos_policy``              ``"bos"`` or ``"no_bos"``: whether the prefix starts with BOS
``adapters``                the ordered LoRA adapters as ``(sha256, scale)``
==========================  ===================================================================

``segments`` describe the stable prefix (kind, byte and token ranges, sha256) and are *not* part
of the identity. :attr:`ContextManifest.identity_digest` is the engine's ``cache_identity``, so
every reuse path of the server (own slot, donor slot, RAM cache) checks the same identity.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llamapy.errors import ManifestMismatchError
from llamapy.fingerprint import model_fingerprint

__all__ = [
    "IDENTITY_FIELDS",
    "MANIFEST_VERSION",
    "ContextManifest",
    "ManifestSegment",
    "file_digest",
    "sha256_hex",
]

MANIFEST_VERSION = 1
IDENTITY_FIELDS = ("model_digest", "tokenizer", "chat_template_digest", "runtime_digest",
                   "bos_policy", "adapters")
#: Identity fields a host can verify; a declared manifest must match them.
VERIFIED_FIELDS = ("model_digest", "tokenizer", "runtime_digest", "adapters")


def sha256_hex(data: bytes | str) -> str:
    """Hex sha256 of bytes (or UTF-8 text)."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


#: The sha256 of a file, computed once per version of it: the model fingerprint
#: (:func:`llamapy.fingerprint.model_fingerprint`) under the name sessions have always used.
file_digest = model_fingerprint


def runtime_digest(runtime: Mapping[str, Any]) -> str:
    """Digest of runtime settings (canonical JSON)."""
    return sha256_hex(json.dumps(dict(runtime), sort_keys=True, default=str))


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestSegment:
    """One stable segment of a prefix: bytes ``[byte_start, byte_end)`` of the prefix text and
    tokens ``[token_start, token_end)`` of its token ids; ``sha256`` of its text (or of its
    token ids, as decimal text, for token input)."""

    kind: str
    byte_start: int
    byte_end: int
    token_start: int
    token_end: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextManifest:
    """Identity of resident KV plus the stable segments of the prefix (see the module doc)."""

    model_digest: str
    tokenizer: str
    chat_template_digest: str
    runtime_digest: str
    bos_policy: str
    adapters: tuple[tuple[str, float], ...] = ()
    runtime: Mapping[str, Any] = field(default_factory=dict)
    segments: tuple[ManifestSegment, ...] = ()
    version: int = MANIFEST_VERSION

    @property
    def identity(self) -> dict[str, Any]:
        """The identity fields by name."""
        return {name: getattr(self, name) for name in IDENTITY_FIELDS}

    @property
    def identity_digest(self) -> str:
        """sha256 over the identity fields: the engine ``cache_identity``."""
        ident = self.identity
        ident["adapters"] = [[d, float(s)] for d, s in self.adapters]
        return sha256_hex(json.dumps({"v": self.version, **ident}, sort_keys=True))

    def compare(self, other: ContextManifest) -> None:
        """Raise :class:`ManifestMismatchError` ``(field, expected=self's, got=other's)`` on the
        first identity field that differs."""
        if self.version != other.version:
            raise ManifestMismatchError("version", self.version, other.version)
        for name in IDENTITY_FIELDS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                raise ManifestMismatchError(name, mine, theirs)

    def check_verified(self, other: ContextManifest) -> None:
        """Raise :class:`ManifestMismatchError` on the first field a host can verify (model,
        tokenizer, runtime, adapters, and the format version) that differs; the fields a
        caller declares (chat template, BOS policy) are not compared."""
        if self.version != other.version:
            raise ManifestMismatchError("version", self.version, other.version)
        for name in VERIFIED_FIELDS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                raise ManifestMismatchError(name, mine, theirs)

    def compatible(self, other: ContextManifest) -> bool:
        """Whether the identities are equal."""
        return self.identity_digest == other.identity_digest

    def replace(self, **changes: Any) -> ContextManifest:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (round-trips through :meth:`from_dict`)."""
        return {
            "version": self.version, **self.identity,
            "adapters": [[d, float(s)] for d, s in self.adapters],
            "runtime": dict(self.runtime),
            "segments": [s.to_dict() for s in self.segments],
            "identity_digest": self.identity_digest,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContextManifest:
        """Inverse of :meth:`to_dict`; the stored ``identity_digest`` must match."""
        manifest = cls(
            version=int(data["version"]), model_digest=data["model_digest"],
            tokenizer=data["tokenizer"], chat_template_digest=data["chat_template_digest"],
            runtime_digest=data["runtime_digest"], bos_policy=data["bos_policy"],
            adapters=tuple((str(d), float(s)) for d, s in data.get("adapters", ())),
            runtime=dict(data.get("runtime", {})),
            segments=tuple(ManifestSegment(**s) for s in data.get("segments", ())),
        )
        stored = data.get("identity_digest")
        if stored is not None and stored != manifest.identity_digest:
            raise ManifestMismatchError("identity_digest", stored, manifest.identity_digest)
        return manifest


def declared_identity(base: ContextManifest, declared: ContextManifest | None,
                      bos_policy: str | None) -> ContextManifest:
    """The identity of a prefix: ``base`` (the host's) with the caller's fields of ``declared``
    (chat template digest, BOS policy) once its verifiable fields match, else ``base`` with an
    explicit ``bos_policy``. ``ManifestMismatchError(field, host's, declared)`` otherwise."""
    if declared is None:
        return base if bos_policy is None else base.replace(bos_policy=bos_policy)
    for name in VERIFIED_FIELDS:
        if getattr(base, name) != getattr(declared, name):
            raise ManifestMismatchError(name, getattr(base, name), getattr(declared, name))
    return base.replace(chat_template_digest=declared.chat_template_digest,
                        bos_policy=declared.bos_policy)


def segments_for(parts: Sequence[tuple[str, str, Sequence[int]]]) -> tuple[ManifestSegment, ...]:
    """Manifest segments for consecutive ``(kind, text, token_ids)`` parts."""
    out, byte_at, tok_at = [], 0, 0
    for kind, text, token_ids in parts:
        n_bytes = len(text.encode())
        payload = text if text else ",".join(map(str, token_ids))
        out.append(ManifestSegment(kind=kind, byte_start=byte_at, byte_end=byte_at + n_bytes,
                                   token_start=tok_at, token_end=tok_at + len(token_ids),
                                   sha256=sha256_hex(payload)))
        byte_at += n_bytes
        tok_at += len(token_ids)
    return tuple(out)
