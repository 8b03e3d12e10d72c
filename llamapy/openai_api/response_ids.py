"""Ids of Responses that tell which conversation they belong to.

A response's id is ``resp_`` and 24 hex digits, the first 8 of which are its conversation's
*tag*: a digest of the first turn's ``instructions`` and ``input`` (so the first turn's tag is
known before it runs), carried over by every response that continues it by
``previous_response_id``; a turn of a stored ``conversation`` takes its tag from the
conversation's id. A router that sees only the request (Ray Serve's ingress,
:mod:`llamapy.ray.keys`) can so send every turn of one conversation to the replica that holds
its KV and its stored items, though a continued turn carries only its new items. The tag is
no secret and names nothing: two conversations with the same first turn share it, as they
share its KV.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["chain_tag", "conversation_tag", "response_id"]

_OURS = re.compile(r"resp_([0-9a-f]{8})[0-9a-f]{16}")


def _digest(*parts: object) -> str:
    """8 hex digits of ``parts`` (random for what JSON cannot hold: a tag routes, never
    fails a request)."""
    try:
        text = orjson.dumps(parts, default=str, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return secrets.token_hex(4)
    return hashlib.sha256(text).hexdigest()[:8]


def chain_tag(response_id: str) -> str:
    """The conversation tag of a response id (an id of another shape: a digest of it)."""
    found = _OURS.fullmatch(response_id)
    return found.group(1) if found else _digest("id", response_id)


def conversation_tag(request: Mapping[str, Any]) -> str:
    """The tag of the conversation a Responses request belongs to: its
    ``previous_response_id``'s, its ``conversation``'s, or (a first turn) its own."""
    previous, conversation = request.get("previous_response_id"), request.get("conversation")
    if isinstance(previous, str) and previous:
        return chain_tag(previous)
    if isinstance(conversation, Mapping):
        conversation = conversation.get("id")
    if isinstance(conversation, str) and conversation:
        return _digest("conversation", conversation)
    return _digest("first", request.get("instructions"), request.get("input"))


def response_id(tag: str) -> str:
    """A new response id in the conversation tagged ``tag``."""
    return f"resp_{tag}{secrets.token_hex(8)}"
