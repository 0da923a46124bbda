"""The event log's SQLite schema and its migrations (voice.log.store opens
and upgrades a log with them): the table, and the indexes and triggers by
which the database itself keeps the log append-only and each terminal event
single."""

from __future__ import annotations

SCHEMA_VERSION = 4

# Each entry upgrades a database from version N-1 to N. Version 0 is the
# first layout (events table only); every later step must keep old rows valid.
MIGRATIONS: dict[int, str] = {
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
    # A tool call is named by its turn and step as well as its id. Before
    # ids were minted from the log (issue #11) a provider's ids ("skill_1",
    # "call_0") restarted in every process, so a later turn could reuse an
    # earlier turn's id, and the version-2 indexes then refused that turn's
    # own result or receipt: a log wedged for good. Keyed by the turn and step
    # too, every call already in such a log has its own slot, and recovery
    # can close it. New ids are unique in the log anyway (they hold the turn).
    3: """
    DROP INDEX IF EXISTS one_tool_result;
    DROP INDEX IF EXISTS one_receipt_per_phase;
    CREATE UNIQUE INDEX one_tool_result
        ON events(conversation, turn, step, json_extract(payload, '$.tool_call_id')) WHERE type = 'tool/result';
    CREATE UNIQUE INDEX one_receipt_per_phase
        ON events(conversation, turn, step, json_extract(payload, '$.tool_call_id'), json_extract(payload, '$.phase'))
        WHERE type = 'effect/receipt';
    """,
    # Per-turn cost stays flat however long the log (issue #14): a new turn's
    # id is MAX(turn) of any row, read from an index on turn. The others are
    # partial, written only for the rows they hold: turn starts (a context
    # window finds a conversation's newest turns and where each begins), and
    # the rare conversation ends and summaries.
    4: """
    CREATE INDEX IF NOT EXISTS turn_ids ON events(turn);
    CREATE INDEX IF NOT EXISTS turns_of_conversation ON events(conversation, turn, seq) WHERE type = 'turn/start';
    CREATE INDEX IF NOT EXISTS conversation_ends ON events(conversation, seq) WHERE type = 'conversation/end';
    CREATE INDEX IF NOT EXISTS conversation_summaries ON events(conversation, seq)
        WHERE type = 'conversation/summary';
    """,
}

BASE_TABLE = """
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
