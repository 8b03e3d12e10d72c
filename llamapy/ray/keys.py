"""The routing key of a request: what the affinity router matches replicas on.

A key has three parts, matched in this order (see :mod:`llamapy.ray.affinity`):

- ``session``: the conversation or client the request belongs to: the ``x-session-id`` header,
  else the body's ``session`` (llamapy's request option), ``prompt_cache_key`` (Responses),
  ``user`` (OpenAI) or ``metadata.user_id`` (Anthropic), else for a Responses request its
  conversation's tag (:mod:`llamapy.openai_api.response_ids`: every turn of a conversation
  continued by ``previous_response_id`` has its first turn's tag, though it carries only its
  new items). Its KV, and its stored items, are on the replica that served it last.
- ``scope``: where the request's KV may be reused: its tenant (the API key's, passed in by the
  ingress: :mod:`llamapy.ray.tenancy`) and the body's ``cache_scope`` inside it. Replicas only
  reuse KV within a scope, and a replica's stats list the scopes it holds, each by
  :func:`scope_id`, an opaque digest: stats never name a tenant or a scope.
- ``prefix``: cumulative hashes of the prompt's text in blocks of :data:`BLOCK_CHARS`
  characters (at most :data:`MAX_BLOCKS`): ``prefix[i]`` hashes the first ``(i + 1)`` blocks.
  Two requests share their ``k`` first hashes exactly when their texts share the first ``k``
  blocks, so the longest shared prefix is the longest run of hashes a replica is known for.

The session and the prefix hashes are digests seeded with the tenant, the scope and the body's
``cache_salt`` (as the engine keys reuse and session affinity), so two tenants, two scopes or
two salts never share an entry of the router's table, whatever their sessions and prompts;
and the table's size does not depend on what clients send. A ``cache_scope`` or ``cache_salt``
the engine would refuse (not a printable string of 1 to 256 characters) counts as absent: the
replica answers the 400.

The text is the request's messages (role and text of each, the system prompt first), its
``prompt`` or its Responses ``instructions`` + ``input``: what the chat template renders, in the
same order, so a shared prefix of the text is a shared prefix of the tokens. Nothing here
imports Ray; the ingress computes keys, the router reads them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..openai_api.response_ids import conversation_tag
from ..options.deployment import DEPLOYMENT_DEFAULTS
from ..options.sampling import SCOPE_CHARS

#: The request header that names a session (takes precedence over the body's fields).
SESSION_HEADER = "x-session-id"

#: Characters per prefix block, and the most blocks hashed (the first 8 KiB of text).
BLOCK_CHARS = DEPLOYMENT_DEFAULTS.block_chars
MAX_BLOCKS = DEPLOYMENT_DEFAULTS.max_blocks

#: The Responses routes whose requests belong to a conversation by its tag.
RESPONSES_PATHS = ("/responses", "/responses/compact")

#: Body fields naming a session, in order of precedence.
SESSION_FIELDS = ("session", "prompt_cache_key", "user")

_SEP_FIELD = "\x1f"
_SEP_ITEM = "\x1e"


@dataclass(frozen=True, slots=True)
class RoutingKey:
    """What a request is routed by (see the module docstring); every part may be empty."""

    session: str | None = None
    scope: str | None = None
    prefix: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """Whether the key names nothing (the router then routes by load alone)."""
        return self.session is None and not self.prefix


def routing_key(headers: Mapping[str, str], body: Any, *, tenant: str | None = None,
                block_chars: int = BLOCK_CHARS, max_blocks: int = MAX_BLOCKS,
                path: str = "") -> RoutingKey:
    """The key of a request to ``path`` with these (lower-case) ``headers`` and parsed JSON
    ``body`` (anything that is not a JSON object contributes nothing) from ``tenant`` (None:
    the default tenant)."""
    fields = body if isinstance(body, Mapping) else {}
    scope, salt = _scope_field(fields, "cache_scope"), _scope_field(fields, "cache_salt")
    session = _session(headers, fields)
    if session is None and path.rstrip("/").endswith(RESPONSES_PATHS):
        session = "conversation:" + conversation_tag(fields)
    reuse = [tenant, scope, salt]
    prefix = prefix_hashes(prompt_text(fields), None if reuse == [None, None, None]
                           else _digest("prefix", *reuse),
                           block_chars=block_chars, max_blocks=max_blocks)
    return RoutingKey(session=None if session is None else _digest("session", *reuse, session),
                      scope=scope_id(tenant, scope), prefix=prefix)


def scope_id(tenant: str | None, cache_scope: str | None) -> str | None:
    """How routing keys and replica stats name the scope ``cache_scope`` of ``tenant``: an
    opaque digest (None for the default tenant's shared pool, which every replica holds)."""
    if tenant is None and cache_scope is None:
        return None
    return _digest("scope", tenant, cache_scope)


def _digest(*parts: str | None) -> str:
    """A short digest of ``parts`` (JSON-encoded: distinct parts never collide by joining)."""
    return hashlib.blake2b(json.dumps(parts).encode(), digest_size=8).hexdigest()


def _scope_field(fields: Mapping[str, Any], name: str) -> str | None:
    """The body's ``name`` if the engine would take it as a scope or salt, else None."""
    value = fields.get(name)
    ok = isinstance(value, str) and 0 < len(value) <= SCOPE_CHARS and value.isprintable()
    return value if ok else None


def _session(headers: Mapping[str, str], fields: Mapping[str, Any]) -> str | None:
    """The session named by the header or the first body field that names one."""
    header = headers.get(SESSION_HEADER, "").strip()
    if header:
        return header
    metadata = fields.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    for value in (*(fields.get(name) for name in SESSION_FIELDS), user_id):
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            return str(value)
    return None


def prompt_text(fields: Mapping[str, Any]) -> str:
    """The request's prompt as one string: system prompt and messages, or ``prompt``, or
    ``instructions`` and ``input`` (role and text of each message; other content ignored)."""
    parts: list[str] = []
    for name in ("system", "instructions"):
        if name in fields:
            parts.append(f"system{_SEP_FIELD}{_text(fields[name])}")
    for name in ("messages", "input"):
        items = fields.get(name)
        if isinstance(items, list):
            parts.extend(_message(item) for item in items)
        elif isinstance(items, str):
            parts.append(f"user{_SEP_FIELD}{items}")
    if not parts and "prompt" in fields:
        parts.append(_text(fields["prompt"]))
    return _SEP_ITEM.join(parts)


def _message(item: Any) -> str:
    """``role<US>text`` of one message (a bare string is its own text)."""
    if not isinstance(item, Mapping):
        return _text(item)
    return f"{item.get('role', '')}{_SEP_FIELD}{_text(item.get('content'))}"


def _text(value: Any) -> str:
    """The text in a content value: a string, a list of parts (their ``text``) or tokens."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(part) for part in value)
    if isinstance(value, Mapping):
        text = value.get("text")
        return text if isinstance(text, str) else _text(value.get("content"))
    if isinstance(value, int) and not isinstance(value, bool):
        return f"<{value}>"
    return ""


def prefix_hashes(text: str, seed: str | None, *, block_chars: int = BLOCK_CHARS,
                  max_blocks: int = MAX_BLOCKS) -> tuple[str, ...]:
    """Cumulative hashes of ``text``'s full blocks (a last partial block is not hashed: it is
    the prefix of no longer text), seeded with ``seed`` (what the KV is reused within)."""
    digest = hashlib.blake2b(f"{seed or ''}{_SEP_FIELD}".encode(), digest_size=8)
    out: list[str] = []
    for start in range(0, min(len(text), block_chars * max_blocks) - block_chars + 1,
                       block_chars):
        digest.update(text[start:start + block_chars].encode("utf-8", "surrogatepass"))
        out.append(digest.copy().hexdigest())
    return tuple(out)
