"""llama-server's slot actions: ``POST /slots/{id}?action=save|restore|erase``.

Enabled by ``--slot-save-path DIR`` (otherwise 501, as llama-server answers). ``save`` writes the
idle slot's KV with its tokens and cache key to ``DIR/<filename>``; ``restore`` loads it back
into an idle slot (the next request sharing the prefix reuses it, in the saved
``cache_scope`` only); ``erase`` drops the slot's KV. The responses are llama-server's
(``n_saved`` / ``n_written``, ``n_restored`` / ``n_read``, ``n_erased``, ``timings``).

File format (ours, version 1): ``LLPYSLOT``, a 4-byte little-endian header length, a JSON header
(model file name and vocabulary size, cache key, token count, sha256 of the body), then the
tokens as int32 and the state bytes. A file of another model, a bad checksum or a truncated file
is a 400 that names the problem; the slot is left empty. Filenames are one path component of
letters, digits, ``.``, ``_`` and ``-`` (no directories, not starting with a dot).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import time
from pathlib import Path
from typing import Any

from ..engine.request import CacheKey
from ..engine.slot_state import SlotState
from ..errors import EndpointDisabledError, InvalidRequestError
from ..openai_api import ServedModel

__all__ = ["slot_action"]

MAGIC = b"LLPYSLOT"
VERSION = 1
_FILENAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")


def slot_action(served: ServedModel, folder: str | None, slot_id: int, action: str,
                body: Any) -> dict[str, Any]:
    """Run one slot action (blocking: call it off the event loop)."""
    if folder is None:
        raise EndpointDisabledError("This server does not support slots action. Start it with "
                                    "`--slot-save-path`")
    if action == "erase":
        n = served.server.call(lambda engine: engine.slot_state.erase(slot_id))
        return {"id_slot": slot_id, "n_erased": n}
    if action not in ("save", "restore"):
        raise InvalidRequestError(f"Invalid action {action!r} (save, restore or erase)")
    filename = body.get("filename") if isinstance(body, dict) else None
    if not isinstance(filename, str) or not _FILENAME.fullmatch(filename):
        raise InvalidRequestError("Invalid filename: one path component of letters, digits, "
                                  "'.', '_' and '-'")
    path = Path(folder) / filename
    if action == "save":
        return _save(served, path, slot_id)
    return _restore(served, path, slot_id)


def _save(served: ServedModel, path: Path, slot_id: int) -> dict[str, Any]:
    started = time.perf_counter()
    saved = served.server.call(lambda engine: engine.slot_state.save(slot_id))
    data = encode(saved, _model_id(served))
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_bytes(data)
    os.replace(temp, path)
    return {"id_slot": slot_id, "filename": path.name, "n_saved": len(saved.token_ids),
            "n_written": len(data), "timings": {"save_ms": _ms(started)}}


def _restore(served: ServedModel, path: Path, slot_id: int) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidRequestError(f"Unable to restore slot: cannot read {path.name}: "
                                  f"{exc.strerror or exc}") from exc
    saved = decode(data, _model_id(served))
    n = served.server.call(lambda engine: engine.slot_state.restore(slot_id, saved))
    return {"id_slot": slot_id, "filename": path.name, "n_restored": n, "n_read": len(data),
            "timings": {"restore_ms": _ms(started)}}


def _model_id(served: ServedModel) -> dict[str, Any]:
    model = served.server.model
    return {"model": Path(served.server.model_path).name, "n_vocab": model.n_vocab}


def encode(saved: SlotState, model: dict[str, Any]) -> bytes:
    """A slot file's bytes."""
    body = struct.pack(f"<{len(saved.token_ids)}i", *saved.token_ids) + saved.state
    key = saved.key
    header = {"version": VERSION, **model, "n_tokens": len(saved.token_ids),
              "cache_scope": key.cache_scope, "cache_identity": key.cache_identity,
              "tenant": key.tenant, "salt": key.salt,
              "adapter_set": [list(a) if isinstance(a, tuple) else a for a in key.adapter_set],
              "sha256": hashlib.sha256(body).hexdigest()}
    head = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + body


def decode(data: bytes, model: dict[str, Any]) -> SlotState:
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
                                  "(vocabulary differs or another file)")
    key = CacheKey(header.get("cache_scope"), header.get("cache_identity", ""),
                   tuple(tuple(a) for a in header.get("adapter_set", ())),
                   header.get("tenant"), header.get("salt"))
    tokens = struct.unpack_from(f"<{n}i", body)
    return SlotState(body[4 * n:], tuple(tokens), key)


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
