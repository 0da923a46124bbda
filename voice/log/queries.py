"""Reading the event log: the queries of `EventStore` (a mixin over its
connection, `_db`), apart from its writes. Each is an index walk where the
log is long (issue #14): the cost of the answer, not of the conversation."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from voice.log.events import EVENT_TYPES, DamagedEvent, Event


class EventQueries:
    _db: sqlite3.Connection


    def events(
        self,
        conversation: str | None = None,
        *,
        turn: int | None = None,
        types: set[str] | frozenset[str] | None = None,
        after_seq: int = 0,
    ) -> list[Event]:
        """Events in log order (of a conversation, a turn, some types, after a seq)."""
        sql = "SELECT seq, conversation, turn, step, attempt, type, payload, at_mono, at_wall FROM events WHERE seq > ?"
        args: list[Any] = [after_seq]
        if conversation is not None:
            sql += " AND conversation = ?"
            args.append(conversation)
        if turn is not None:
            if conversation is not None:  # from where the turn begins (by index): a turn costs what follows it
                start = self._turn_start(conversation, turn)
                if start is not None:
                    args[0] = max(after_seq, start - 1)
            sql += " AND turn = ?"
            args.append(turn)
        if types:
            sql += f" AND type IN ({','.join('?' * len(types))})"
            args.extend(sorted(types))
        sql += " ORDER BY seq"
        return [self._row(r) for r in self._db.execute(sql, args)]

    @staticmethod
    def _row(r: tuple) -> Event:
        try:
            payload = json.loads(r[6])
        except (json.JSONDecodeError, TypeError, UnicodeDecodeError):
            payload = None
        if not isinstance(payload, dict):
            raise DamagedEvent(r[0], r[5], "has a payload that is not a JSON object")
        return Event(r[0], r[1], r[2], r[3], r[4], r[5], payload, r[7], r[8])

    def conversations(self) -> list[str]:
        """Conversation ids, oldest first (by their first event)."""
        rows = self._db.execute("SELECT conversation, MIN(seq) AS first FROM events GROUP BY conversation ORDER BY first")
        return [r[0] for r in rows]

    def turns(self, conversation: str, *, before: int | None = None, limit: int = 64) -> list[int]:
        """The conversation's turn ids, newest first: at most `limit`, all
        below `before` when given (an index walk: the cost of the answer,
        not of the conversation)."""
        sql = "SELECT turn FROM events WHERE type = 'turn/start' AND conversation = ?"  # the partial index
        args: list[Any] = [conversation]
        if before is not None:
            sql += " AND turn < ?"
            args.append(before)
        return [r[0] for r in self._db.execute(sql + " ORDER BY turn DESC LIMIT ?", [*args, limit])]

    def _turn_start(self, conversation: str, turn: int, *, following: bool = False) -> int | None:
        """The seq where the conversation's turn begins (`following`: where the
        first turn after it begins), by the partial index of turn starts."""
        (seq,) = self._db.execute("SELECT MIN(seq) FROM events WHERE type = 'turn/start' AND conversation = ?"
                                  f" AND turn {'>' if following else '='} ?", (conversation, turn)).fetchone()
        return seq

    def turn_events(self, conversation: str, turns: list[int], types: set[str] | frozenset[str]) -> list[Event]:
        """The events of these turns (ids of the conversation, as `turns`
        gives them), in log order: read from where the oldest of them begins,
        so the cost is theirs and what came after them, not the conversation's."""
        if not turns:
            return []
        low, high = min(turns), max(turns)
        start, after = self._turn_start(conversation, low), self._turn_start(conversation, high, following=True)
        sql = ("SELECT seq, conversation, turn, step, attempt, type, payload, at_mono, at_wall FROM events"
               f" WHERE conversation = ? AND seq >= ? AND seq < ? AND type IN ({','.join('?' * len(types))})"
               " ORDER BY seq")
        rows = self._db.execute(sql, [conversation, start or 0, after or 2**62, *sorted(types)])
        return [e for e in map(self._row, rows) if e.turn is not None and low <= e.turn <= high]

    def first_turn(self, conversation: str, *, after: int = 0) -> int | None:
        """The conversation's oldest turn id above `after` (by index)."""
        (turn,) = self._db.execute("SELECT MIN(turn) FROM events WHERE type = 'turn/start' AND conversation = ?"
                                   " AND turn > ?", (conversation, after)).fetchone()
        return turn

    def last_of(self, conversation: str, types: set[str] | frozenset[str]) -> Event | None:
        """The conversation's latest event of these types. A conversation's
        end or summary is found by its own index; other kinds by walking the
        conversation back from its newest event (they are frequent)."""
        if not set(types) <= EVENT_TYPES:
            raise ValueError(f"unknown event types {sorted(set(types) - EVENT_TYPES)}")
        # Literal types (checked above): a partial index serves only a query that names its type.
        kinds = " OR ".join(f"type = '{t}'" for t in sorted(types))
        row = self._db.execute(
            "SELECT seq, conversation, turn, step, attempt, type, payload, at_mono, at_wall FROM events"
            f" WHERE conversation = ? AND ({kinds}) ORDER BY seq DESC LIMIT 1", (conversation,)
        ).fetchone()
        return self._row(row) if row else None

    def conversation_spans(self) -> list[tuple[str, int, float, float]]:
        """(conversation, events, first at_wall, last at_wall), oldest first."""
        rows = self._db.execute("SELECT conversation, COUNT(*), MIN(at_wall), MAX(at_wall), MIN(seq) AS first"
                                " FROM events GROUP BY conversation ORDER BY first")
        return [(r[0], r[1], r[2], r[3]) for r in rows]

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
