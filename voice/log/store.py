"""The durable, append-only event log: SQLite in WAL mode.

Invariants the database itself enforces:
- rows are never updated or deleted (triggers abort such statements);
- each (conversation, turn) has at most one `turn/end` (a partial unique
  index), so a stop racing a completion yields one terminal outcome.

Appends are synchronous and small (one INSERT + COMMIT in WAL with
synchronous=NORMAL, durable against a process crash); see
benchmarks/log_append.py for the measured cost.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from voice.log.events import EVENT_TYPES, TURN_END, TURN_START, Event, encode_payload

SCHEMA_VERSION = 2

# Each entry upgrades a database from version N-1 to N. Version 0 is the
# first layout (events table only); every later step must keep old rows valid.
_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE UNIQUE INDEX IF NOT EXISTS one_turn_end
        ON events(conversation, turn) WHERE type = 'turn/end';
    CREATE INDEX IF NOT EXISTS events_by_conversation ON events(conversation, seq);
    CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
        BEGIN SELECT RAISE(ABORT, 'the event log is append-only'); END;
    CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
        BEGIN SELECT RAISE(ABORT, 'the event log is append-only'); END;
    """,
    # One terminal state per tool call: one result, one receipt per phase.
    2: """
    CREATE UNIQUE INDEX IF NOT EXISTS one_tool_result
        ON events(conversation, json_extract(payload, '$.tool_call_id')) WHERE type = 'tool/result';
    CREATE UNIQUE INDEX IF NOT EXISTS one_receipt_per_phase
        ON events(conversation, json_extract(payload, '$.tool_call_id'), json_extract(payload, '$.phase'))
        WHERE type = 'effect/receipt';
    """,
}

_BASE_TABLE = """
CREATE TABLE IF NOT EXISTS events (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation TEXT    NOT NULL,
    turn         INTEGER,
    step         INTEGER,
    attempt      INTEGER,
    type         TEXT    NOT NULL,
    payload      TEXT    NOT NULL,
    at_mono      REAL    NOT NULL,
    at_wall      REAL    NOT NULL
);
"""


class DuplicateTerminal(Exception):
    """A second terminal event (tool result, receipt) for one tool call was
    refused by the database."""


class DuplicateTurnEnd(DuplicateTerminal):
    """A second `turn/end` for the same turn was refused by the database."""


class EventStore:
    """Append and read events. One instance per process; safe to use from
    the event loop thread (appends are sub-millisecond)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        try:
            self._check_version()
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._migrate()
        except (sqlite3.DatabaseError, ValueError) as exc:
            self._db.close()
            if isinstance(exc, ValueError):
                raise
            raise ValueError(f"cannot open the event log {self.path}: {exc}") from exc

    def _check_version(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"the event log {self.path} has schema version {version}, newer than this "
                f"program's {SCHEMA_VERSION}: upgrade voice"
            )

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        self._db.executescript(_BASE_TABLE)
        for target in range(version + 1, SCHEMA_VERSION + 1):
            self._db.executescript("BEGIN;" + _MIGRATIONS[target] + f"PRAGMA user_version={target}; COMMIT;")

    def close(self) -> None:
        self._db.close()

    # -- writing -----------------------------------------------------------

    def append(
        self,
        conversation: str,
        type: str,
        payload: dict[str, Any] | None = None,
        *,
        turn: int | None = None,
        step: int | None = None,
        attempt: int | None = None,
    ) -> Event:
        if type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {type!r}")
        payload = payload or {}
        text = encode_payload(payload)
        at_mono, at_wall = time.monotonic(), time.time()
        try:
            cur = self._db.execute(
                "INSERT INTO events(conversation, turn, step, attempt, type, payload, at_mono, at_wall)"
                " VALUES (?,?,?,?,?,?,?,?)",
                (conversation, turn, step, attempt, type, text, at_mono, at_wall),
            )
        except sqlite3.IntegrityError as exc:
            if type == TURN_END:
                raise DuplicateTurnEnd(f"turn {turn} of {conversation} already ended") from exc
            raise DuplicateTerminal(f"{type} for {payload.get('tool_call_id')} of {conversation} already recorded") from exc
        return Event(cur.lastrowid, conversation, turn, step, attempt, type, payload, at_mono, at_wall)

    def start_turn(self, conversation: str, payload: dict[str, Any]) -> int:
        """Allocate a new turn id (global, increasing) and log `turn/start`."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            (last,) = self._db.execute("SELECT COALESCE(MAX(turn), 0) FROM events").fetchone()
            turn = last + 1
            self._db.execute(
                "INSERT INTO events(conversation, turn, step, attempt, type, payload, at_mono, at_wall)"
                " VALUES (?,?,?,?,?,?,?,?)",
                (conversation, turn, None, None, TURN_START, encode_payload(payload), time.monotonic(), time.time()),
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return turn

    def end_turn(self, conversation: str, turn: int, outcome: str, **details: Any) -> bool:
        """Log the turn's one terminal outcome. Returns False (and writes
        nothing) when the turn had already ended: the first outcome wins."""
        try:
            self.append(conversation, TURN_END, {"outcome": outcome, **details}, turn=turn)
        except DuplicateTurnEnd:
            return False
        return True

    def copy_events(self, events: list[Event], conversation: str) -> None:
        """Copy events into another conversation (forks), keeping their ids,
        payloads and times, in one transaction."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany(
                "INSERT INTO events(conversation, turn, step, attempt, type, payload, at_mono, at_wall)"
                " VALUES (?,?,?,?,?,?,?,?)",
                [
                    (conversation, e.turn, e.step, e.attempt, e.type, encode_payload(e.payload), e.at_mono, e.at_wall)
                    for e in events
                ],
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    # -- reading -----------------------------------------------------------

    def events(
        self,
        conversation: str | None = None,
        *,
        turn: int | None = None,
        types: set[str] | frozenset[str] | None = None,
        after_seq: int = 0,
    ) -> list[Event]:
        sql = "SELECT seq, conversation, turn, step, attempt, type, payload, at_mono, at_wall FROM events WHERE seq > ?"
        args: list[Any] = [after_seq]
        if conversation is not None:
            sql += " AND conversation = ?"
            args.append(conversation)
        if turn is not None:
            sql += " AND turn = ?"
            args.append(turn)
        if types:
            sql += f" AND type IN ({','.join('?' * len(types))})"
            args.extend(sorted(types))
        sql += " ORDER BY seq"
        return [self._row(r) for r in self._db.execute(sql, args)]

    @staticmethod
    def _row(r: tuple) -> Event:
        return Event(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), r[7], r[8])

    def conversations(self) -> list[str]:
        """Conversation ids, oldest first (by their first event)."""
        rows = self._db.execute("SELECT conversation, MIN(seq) AS first FROM events GROUP BY conversation ORDER BY first")
        return [r[0] for r in rows]

    def latest_conversation(self) -> str | None:
        row = self._db.execute("SELECT conversation FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        return row[0] if row else None

    def conversations_of_turn(self, turn: int) -> list[str]:
        rows = self._db.execute(
            "SELECT conversation, MIN(seq) AS first FROM events WHERE turn = ? GROUP BY conversation ORDER BY first",
            (turn,),
        )
        return [r[0] for r in rows]

    def open_turns(self, conversation: str | None = None) -> list[tuple[str, int]]:
        """(conversation, turn) pairs with a `turn/start` and no `turn/end`."""
        sql = (
            "SELECT s.conversation, s.turn FROM events s WHERE s.type = 'turn/start'"
            " AND NOT EXISTS (SELECT 1 FROM events e WHERE e.type = 'turn/end'"
            " AND e.conversation = s.conversation AND e.turn = s.turn)"
        )
        args: list[Any] = []
        if conversation is not None:
            sql += " AND s.conversation = ?"
            args.append(conversation)
        return [(r[0], r[1]) for r in self._db.execute(sql + " ORDER BY s.seq", args)]

    def last_seq(self) -> int:
        (seq,) = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
        return seq


def new_conversation_id() -> str:
    return "c-" + uuid.uuid4().hex[:10]

