"""llama-server's slot actions: ``POST /slots/{id}?action=save|restore|erase``.

Enabled by ``--slot-save-path DIR`` (otherwise 501, as llama-server answers). ``save`` writes the
idle slot's KV with its tokens and cache key to ``DIR/<filename>``, within the slot-file
budgets (a 403 past one) and written safely (:mod:`llamapy.serve.slot_store`); ``restore``
loads it back into an idle slot (the next request sharing the prefix reuses it, in the saved
``cache_scope`` only); ``erase`` drops the slot's KV. The responses are llama-server's
(``n_saved`` / ``n_written``, ``n_restored`` / ``n_read``, ``n_erased``, ``timings``).

File format (ours, version 2): ``LLPYSLOT``, a 4-byte little-endian header length, a JSON header
(model file name, its fingerprint (:func:`llamapy.fingerprint.model_fingerprint`, the sha256 of
its bytes) and vocabulary size, cache key, token count, sha256 of the body), then the tokens as
int32 and the state bytes. A file of another model, a bad checksum or a truncated file
is a 400 that names the problem; the slot is left empty. Filenames are one path component of
letters, digits, ``.``, ``_`` and ``-`` (no directories, not starting with a dot).

Tenants (:mod:`llamapy.serve.tenants`): a tenant's files live in ``DIR/tenant=NAME/`` (the
default tenant's in ``DIR`` itself, see :mod:`~llamapy.serve.slot_store`), an admin's in its
own tenant's, each tenant's within its own budget too. A tenant key may save
only a slot whose KV is its own, restore or erase only one that is its own or empty (checked on
the engine's thread with the action itself), and restore only a file saved by its tenant;
anything else is a 403 (:class:`~llamapy.errors.PermissionDeniedError`) that names no other
tenant. An admin acts on any slot and restores any file of its folder.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...engine.kv_ops import KvState
from ...engine.request import CacheKey
from ...errors import (
    EndpointDisabledError,
    InvalidOptionError,
    InvalidRequestError,
    PermissionDeniedError,
    UnsupportedFeatureError,
)
from ...fingerprint import model_fingerprint
from ...openai_api import ServedModel
from ..slot_store import FILENAME, SlotStore
from ..tenants import OPEN, Principal, check_tenant_name

if TYPE_CHECKING:
    from ...engine.engine import Engine

__all__ = ["slot_action"]

MAGIC = b"LLPYSLOT"
#: 2: the header names the model by its fingerprint too (a file of version 1 is refused).
VERSION = 2


def slot_action(served: ServedModel, store: SlotStore | None, slot_id: int, action: str,
                body: Any, principal: Principal = OPEN) -> dict[str, Any]:
    """Run one slot action for ``principal`` on the files of ``store`` (None: the actions are
    off; blocking: call it off the event loop)."""
    if store is None:
        raise EndpointDisabledError("This server does not support slots action. Start it with "
                                    "`--slot-save-path`")
    if action == "erase":
        n = served.server.call(lambda engine: _erase(engine, slot_id, principal))
        return {"id_slot": slot_id, "n_erased": n}
    if action not in ("save", "restore"):
        raise InvalidRequestError(f"Invalid action {action!r} (save, restore or erase)")
    filename = body.get("filename") if isinstance(body, dict) else None
    if not isinstance(filename, str) or not FILENAME.fullmatch(filename):
        raise InvalidRequestError("Invalid filename: one path component of letters, digits, "
                                  "'.', '_' and '-'")
    check_tenant_name(principal.tenant, "slot files")
    if action == "save":
        return _save(served, store, filename, slot_id, principal)
    return _restore(served, store, filename, slot_id, principal)


def _check_slot(engine: Engine, slot_id: int, principal: Principal, *, empty_ok: bool) -> None:
    """Raise :class:`PermissionDeniedError` unless ``principal`` may act on the slot: an admin,
    or the slot's KV is its tenant's (or it holds none and ``empty_ok``). Engine thread."""
    tenant, n_tokens = engine.slot_ops.holder(slot_id)
    if not (principal.admin or principal.owns(tenant) or (empty_ok and n_tokens == 0)):
        raise PermissionDeniedError(f"slot {slot_id} holds another tenant's cache")


def _erase(engine: Engine, slot_id: int, principal: Principal) -> int:
    _check_slot(engine, slot_id, principal, empty_ok=True)
    return engine.slot_ops.clear(slot_id)


def _save(served: ServedModel, store: SlotStore, filename: str, slot_id: int,
          principal: Principal) -> dict[str, Any]:
    """Save the slot as ``filename`` of ``principal``'s tenant: a file it has no room for is
    refused before the KV is read, one past a byte bound before anything is written."""
    started = time.perf_counter()
    store.check_room(principal.tenant, filename)

    def save(engine: Engine) -> KvState:
        _check_slot(engine, slot_id, principal, empty_ok=False)
        return engine.slot_ops.save(slot_id)

    with store.moving():
        saved = served.server.call(save)
        data = encode(saved, _model_id(served))
        store.save(principal.tenant, filename, data)
    return {"id_slot": slot_id, "filename": filename, "n_saved": len(saved.token_ids),
            "n_written": len(data), "timings": {"save_ms": _ms(started)}}


def _restore(served: ServedModel, store: SlotStore, filename: str, slot_id: int,
             principal: Principal) -> dict[str, Any]:
    started = time.perf_counter()

    def restore(engine: Engine) -> int:
        _check_slot(engine, slot_id, principal, empty_ok=True)
        if not engine.slot_ops.restore(slot_id, saved):
            raise InvalidOptionError(f"slot {slot_id}: the saved state does not fit this "
                                     "model and context (or it is corrupt)", option="filename")
        return len(saved.token_ids)

    with store.moving():
        data = store.read(principal.tenant, filename)
        saved = decode(data, _model_id(served))
        if not (principal.admin or principal.owns(saved.key.tenant)):
            raise PermissionDeniedError(f"Unable to restore slot: {filename} was saved by "
                                        "another tenant")
        n = served.server.call(restore)
    return {"id_slot": slot_id, "filename": filename, "n_restored": n, "n_read": len(data),
            "timings": {"restore_ms": _ms(started)}}


def _model_id(served: ServedModel) -> dict[str, Any]:
    """What a slot file's model must match: the fingerprint of the served file (None for a
    model without one, such as the fake backend's), its name and its vocabulary size."""
    model = served.server.model
    path = Path(served.server.model_path)
    fingerprint = model_fingerprint(path) if path.is_file() else None
    return {"model": path.name, "model_fingerprint": fingerprint, "n_vocab": model.n_vocab}


def encode(saved: KvState, model: dict[str, Any]) -> bytes:
    """A slot file's bytes (``UnsupportedFeatureError`` for a slot holding an image's or an
    audio clip's rows: the file format holds text tokens)."""
    if saved.token_ids and min(saved.token_ids) < 0:
        raise UnsupportedFeatureError("slot_save", "this slot holds an image's or an audio "
                                      "clip's rows: it cannot be saved to a slot file")
    body = struct.pack(f"<{len(saved.token_ids)}i", *saved.token_ids) + saved.state
    key = saved.key
    header = {"version": VERSION, **model, "n_tokens": len(saved.token_ids),
              "cache_scope": key.cache_scope, "cache_identity": key.cache_identity,
              "tenant": key.tenant, "salt": key.salt,
              "adapter_set": [list(a) if isinstance(a, tuple) else a for a in key.adapter_set],
              "sha256": hashlib.sha256(body).hexdigest()}
    head = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + body


def decode(data: bytes, model: dict[str, Any]) -> KvState:
    """A slot file's contents; ``InvalidRequestError`` naming what is wrong with it."""
    fixed = len(MAGIC) + 4
    if len(data) < fixed or not data.startswith(MAGIC):
        raise InvalidRequestError("Unable to restore slot: not a llamapy slot file")
    (size,) = struct.unpack_from("<I", data, len(MAGIC))
    try:
        header = json.loads(data[fixed:fixed + size])
        n = int(header["n_tokens"])
        body = data[fixed + size:]
        ok = header["version"] == VERSION and hashlib.sha256(body).hexdigest() == header["sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidRequestError("Unable to restore slot: corrupt header") from exc
    if not ok or len(body) < 4 * n:
        raise InvalidRequestError("Unable to restore slot: checksum mismatch (a truncated or "
                                  "corrupt file) or another format version")
    if {k: header.get(k) for k in model} != model:
        raise InvalidRequestError(f"Unable to restore slot: saved by model {header.get('model')} "
                                  "(another model file, or the file has changed since)")
    key = CacheKey(header.get("cache_scope"), header.get("cache_identity", ""),
                   tuple(tuple(a) for a in header.get("adapter_set", ())),
                   header.get("tenant"), header.get("salt"))
    tokens = struct.unpack_from(f"<{n}i", body)
    return KvState(body[4 * n:], tuple(tokens), key)


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
