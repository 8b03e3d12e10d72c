"""Stored responses and conversations: one SQLite database, every row under its tenant.

A stored response keeps its own input items and its output, and a link to the response it
continued (``previous_response_id``): continuing a chain rebuilds the whole conversation from
the links, so a 30-turn agent session stores each turn's new items once, not its history 30
times. A conversation keeps its items in order.

Every method takes the tenant (``""`` for requests without one) and reads or writes only that
tenant's rows: another tenant's id is not found, exactly like an id that never existed.

Retention: ``ttl_s`` seconds after its creation a response (or conversation) is no longer
found (0: kept until evicted); ``max_bytes`` bounds the JSON held (0: no bound), evicting the
least recently used first, and ``tenant_max_bytes`` bounds one tenant's, evicting its own
first (so one tenant cannot push everyone else's out). A deleted or expired response that a
newer one continues stays stored (hidden) until no stored response continues it, so a chain
never loses its middle.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from ..errors import InvalidOptionError

__all__ = ["ResponseStore", "storable", "valid_id"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses(
  tenant TEXT NOT NULL, id TEXT NOT NULL, parent TEXT, root TEXT NOT NULL,
  created_at REAL NOT NULL,
  used_at REAL NOT NULL, visible INTEGER NOT NULL, bytes INTEGER NOT NULL,
  response TEXT NOT NULL, input TEXT NOT NULL, PRIMARY KEY (tenant, id));
CREATE INDEX IF NOT EXISTS responses_parent ON responses(tenant, parent);
CREATE TABLE IF NOT EXISTS conversations(
  tenant TEXT NOT NULL, id TEXT NOT NULL, created_at REAL NOT NULL, used_at REAL NOT NULL,
  metadata TEXT NOT NULL, PRIMARY KEY (tenant, id));
CREATE TABLE IF NOT EXISTS conversation_items(
  tenant TEXT NOT NULL, conversation TEXT NOT NULL, seq INTEGER NOT NULL,
  item_id TEXT NOT NULL, bytes INTEGER NOT NULL, item TEXT NOT NULL,
  PRIMARY KEY (tenant, conversation, seq));
CREATE INDEX IF NOT EXISTS conversation_item_ids
  ON conversation_items(tenant, conversation, item_id);
"""

#: The layout above (SQLite's ``user_version``), for the migrations of later versions.
SCHEMA_VERSION = 1

#: Longest chain a continuation rebuilds (a cycle or a corrupt file ends there).
MAX_CHAIN = 10_000

_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def valid_id(value: object) -> bool:
    """Whether ``value`` can name a stored object (anything else is simply not found)."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def storable(value: object, option: str = "input") -> str:
    """``value`` as the JSON text stored; :class:`~llamapy.errors.InvalidOptionError` (a 400
    naming ``option``) for what JSON cannot hold within its nesting bound (items a client
    sends may carry any extra field)."""
    try:  # (orjson: a fixed nesting bound checked in C, no Python recursion on client data)
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError as exc:
        raise InvalidOptionError(f"{option}: cannot be stored ({exc}: nested too deeply or "
                                 "not JSON)", option=option) from None


_dumps = storable


class ResponseStore:
    """The responses and conversations of every tenant (see the module docstring).

    ``path`` is a SQLite file (created 0600 with its folder), or ``":memory:"``. Thread-safe:
    one connection behind a lock (the HTTP layer calls it from worker threads)."""

    def __init__(self, path: str, *, ttl_s: float = 0.0, max_bytes: int = 0,
                 tenant_max_bytes: int = 0, now: Callable[[], float] = time.time) -> None:
        self.path, self.ttl_s, self.max_bytes, self._now = path, ttl_s, max_bytes, now
        self.tenant_max_bytes = tenant_max_bytes
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
        # (the default rollback journal: several servers, or apps in one process, may share
        # the file, and a write waits up to 30 s for another's)
        self._db = sqlite3.connect(path, timeout=30, check_same_thread=False,
                                   isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def _live_after(self) -> float:
        """Rows created at or before this time have expired."""
        return self._now() - self.ttl_s if self.ttl_s > 0 else float("-inf")

    def _rows(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # --- responses ----------------------------------------------------------------------------

    def put_response(self, tenant: str, response: dict[str, Any],
                     input_items: Sequence[dict[str, Any]], parent: str | None) -> None:
        """Store ``response`` (its ``output`` included) with its own ``input_items``, as the
        continuation of ``parent`` (None: a first turn)."""
        body, items = _dumps(response), _dumps(list(input_items))
        now, root = self._now(), self.root(tenant, parent) if parent else response["id"]
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?,?,?,?,?,?,1,?,?,?)",
                (tenant, response["id"], parent, root, now, now, len(body) + len(items), body,
                 items))
            self._evict(tenant)

    def root(self, tenant: str, response_id: str) -> str:
        """The id of the first response of ``response_id``'s chain (itself when unknown)."""
        rows = self._rows("SELECT root FROM responses WHERE tenant=? AND id=?", tenant,
                          response_id)
        return str(rows[0][0]) if rows else response_id

    def get_response(self, tenant: str, response_id: object) -> dict[str, Any] | None:
        """A visible, unexpired response, or None."""
        if not valid_id(response_id):
            return None
        rows = self._rows("SELECT response FROM responses WHERE tenant=? AND id=? AND visible=1 "
                          "AND created_at>?", tenant, response_id, self._live_after())
        return orjson.loads(rows[0][0]) if rows else None

    def input_items(self, tenant: str, response_id: object) -> list[dict[str, Any]] | None:
        """The input items a visible response was created with (its own, not its chain's)."""
        if self.get_response(tenant, response_id) is None:
            return None
        rows = self._rows("SELECT input FROM responses WHERE tenant=? AND id=?",
                          tenant, response_id)
        return orjson.loads(rows[0][0]) if rows else None

    def delete_response(self, tenant: str, response_id: object) -> bool:
        """Hide a visible response (True), kept only while a stored response continues it."""
        if self.get_response(tenant, response_id) is None:
            return False
        with self._lock:
            self._db.execute("UPDATE responses SET visible=0 WHERE tenant=? AND id=?",
                             (tenant, response_id))
            self._sweep()
        return True

    def history(self, tenant: str, response_id: object) -> list[dict[str, Any]] | None:
        """The items of the conversation that ends with a visible response: each response
        of its chain's input, then output, oldest first. None when the response is not found
        (or a link of its chain is gone)."""
        if self.get_response(tenant, response_id) is None:
            return None
        turns: list[list[dict[str, Any]]] = []
        current: str | None = str(response_id)
        while current is not None and len(turns) < MAX_CHAIN:
            rows = self._rows("SELECT parent, input, response FROM responses "
                              "WHERE tenant=? AND id=?", tenant, current)
            if not rows:
                return None
            parent, items, response = rows[0]
            turns.append([*orjson.loads(items), *orjson.loads(response).get("output", ())])
            current = parent
        self._touch("responses", tenant, str(response_id))
        return [item for turn in reversed(turns) for item in turn]

    def _touch(self, table: str, tenant: str, row_id: str) -> None:
        with self._lock:
            self._db.execute(f"UPDATE {table} SET used_at=? WHERE tenant=? AND id=?",
                             (self._now(), tenant, row_id))

    # --- conversations ------------------------------------------------------------------------

    def create_conversation(self, tenant: str, conversation_id: str,
                            metadata: dict[str, str], items: Sequence[dict[str, Any]]) -> float:
        """A new conversation holding ``items``; its creation time."""
        now = self._now()
        with self._lock:
            self._db.execute("INSERT INTO conversations VALUES (?,?,?,?,?)",
                             (tenant, conversation_id, now, now, _dumps(metadata)))
        self.add_items(tenant, conversation_id, items)
        return now

    def get_conversation(self, tenant: str, conversation_id: object
                         ) -> tuple[float, dict[str, str]] | None:
        """``(created_at, metadata)`` of an unexpired conversation, or None."""
        if not valid_id(conversation_id):
            return None
        rows = self._rows("SELECT created_at, metadata FROM conversations WHERE tenant=? AND "
                          "id=? AND created_at>?", tenant, conversation_id, self._live_after())
        return (rows[0][0], orjson.loads(rows[0][1])) if rows else None

    def update_conversation(self, tenant: str, conversation_id: object,
                            metadata: dict[str, str]) -> bool:
        """Replace a conversation's metadata (False: not found)."""
        if self.get_conversation(tenant, conversation_id) is None:
            return False
        with self._lock:
            self._db.execute("UPDATE conversations SET metadata=? WHERE tenant=? AND id=?",
                             (_dumps(metadata), tenant, conversation_id))
        return True

    def delete_conversation(self, tenant: str, conversation_id: object) -> bool:
        """Delete a conversation and its items (False: not found)."""
        if self.get_conversation(tenant, conversation_id) is None:
            return False
        with self._lock:
            self._db.execute("DELETE FROM conversations WHERE tenant=? AND id=?",
                             (tenant, conversation_id))
            self._db.execute("DELETE FROM conversation_items WHERE tenant=? AND conversation=?",
                             (tenant, conversation_id))
        return True

    def add_items(self, tenant: str, conversation_id: str,
                  items: Sequence[dict[str, Any]]) -> None:
        """Append ``items`` (each with an ``id``) to a conversation."""
        with self._lock:
            rows = self._db.execute("SELECT COALESCE(MAX(seq), -1) FROM conversation_items "
                                    "WHERE tenant=? AND conversation=?",
                                    (tenant, conversation_id)).fetchall()
            seq = rows[0][0] + 1
            for offset, item in enumerate(items):
                text = _dumps(item)
                self._db.execute("INSERT INTO conversation_items VALUES (?,?,?,?,?,?)",
                                 (tenant, conversation_id, seq + offset, item["id"], len(text),
                                  text))
            self._db.execute("UPDATE conversations SET used_at=? WHERE tenant=? AND id=?",
                             (self._now(), tenant, conversation_id))
            self._evict(tenant)

    def items(self, tenant: str, conversation_id: object) -> list[dict[str, Any]] | None:
        """A conversation's items, oldest first (None: not found)."""
        if self.get_conversation(tenant, conversation_id) is None:
            return None
        rows = self._rows("SELECT item FROM conversation_items WHERE tenant=? AND "
                          "conversation=? ORDER BY seq", tenant, conversation_id)
        return [orjson.loads(row[0]) for row in rows]

    def delete_item(self, tenant: str, conversation_id: object, item_id: object) -> bool:
        """Delete one item of a conversation (False: either not found)."""
        if self.get_conversation(tenant, conversation_id) is None or not valid_id(item_id):
            return False
        with self._lock:
            cursor = self._db.execute("DELETE FROM conversation_items WHERE tenant=? AND "
                                      "conversation=? AND item_id=?",
                                      (tenant, conversation_id, item_id))
        return cursor.rowcount > 0

    # --- retention ----------------------------------------------------------------------------

    def _sweep(self) -> None:
        """Delete hidden or expired responses nothing continues, until none is left (a
        chain's links go one generation a round); then expired conversations."""
        expired = self._live_after()
        while self._db.execute(
                "DELETE FROM responses WHERE (visible=0 OR created_at<=?) AND NOT EXISTS "
                "(SELECT 1 FROM responses c WHERE c.tenant=responses.tenant AND "
                "c.parent=responses.id)", (expired,)).rowcount:
            pass
        for (tenant, cid) in self._db.execute("SELECT tenant, id FROM conversations WHERE "
                                              "created_at<=?", (expired,)).fetchall():
            self._db.execute("DELETE FROM conversations WHERE tenant=? AND id=?", (tenant, cid))
            self._db.execute("DELETE FROM conversation_items WHERE tenant=? AND "
                             "conversation=?", (tenant, cid))

    def _bytes(self, tenant: str | None = None) -> int:
        """Bytes held, every tenant's (None) or one tenant's."""
        where, args = ("", ()) if tenant is None else (" WHERE tenant=?", (tenant,))
        rows = self._db.execute(f"SELECT (SELECT COALESCE(SUM(bytes), 0) FROM responses"
                                f"{where}) + (SELECT COALESCE(SUM(bytes), 0) FROM "
                                f"conversation_items{where})", args * 2)
        return int(rows.fetchall()[0][0])

    def _evict(self, tenant: str) -> None:
        """Sweep; then, while ``tenant`` holds more than ``tenant_max_bytes``, drop its least
        recently used leaf response (with none left, its least recently used conversation);
        then the same over everyone's ``max_bytes``. A tenant filling the store thus evicts
        its own objects first, never more than its share of anyone else's."""
        self._sweep()
        while self.tenant_max_bytes and self._bytes(tenant) > self.tenant_max_bytes:
            if not self._drop_oldest(tenant):
                break
        while self.max_bytes and self._bytes() > self.max_bytes:
            if not self._drop_oldest(None):
                return

    def _drop_oldest(self, tenant: str | None) -> bool:
        only, args = ("", ()) if tenant is None else (" AND r.tenant=?", (tenant,))
        leaf = self._db.execute(
            "SELECT tenant, id FROM responses r WHERE NOT EXISTS (SELECT 1 FROM responses c "
            f"WHERE c.tenant=r.tenant AND c.parent=r.id){only} ORDER BY used_at LIMIT 1",
            args).fetchall()
        if leaf:
            self._db.execute("DELETE FROM responses WHERE tenant=? AND id=?", leaf[0])
            return True
        conv = self._db.execute("SELECT tenant, id FROM conversations r WHERE 1=1"
                                f"{only} ORDER BY used_at LIMIT 1", args).fetchall()
        for owner, cid in conv:
            self._db.execute("DELETE FROM conversations WHERE tenant=? AND id=?", (owner, cid))
            self._db.execute("DELETE FROM conversation_items WHERE tenant=? AND "
                             "conversation=?", (owner, cid))
        return bool(conv)
