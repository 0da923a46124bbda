"""EventStore (voice/log/store.py) and the event vocabulary (voice/log/events.py):
the durable, append-only SQLite log of docs/EVENTS.md."""

from __future__ import annotations

import json
import random
import sqlite3
import time
from pathlib import Path

import pytest

from voice.log import events as ev
from voice.log.events import EVENT_TYPES, SURFACE_TYPES, Event, encode_payload
from voice.log.schema import SCHEMA_VERSION
from voice.log.store import DuplicateTurnEnd, EventStore, new_conversation_id

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "events.db"


@pytest.fixture
def store(db_path: Path):
    s = EventStore(db_path)
    yield s
    s.close()


def _raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(str(path), isolation_level=None)


def _turn_ends(store: EventStore, conversation: str, turn: int) -> list[Event]:
    return store.events(conversation, turn=turn, types={ev.TURN_END})


# --- the vocabulary -----------------------------------------------------------


def test_event_vocabulary_matches_the_design():
    design_types = {
        "turn/start", "user/message", "step/start", "step/end", "agent/assistant-stream",
        "assistant/message", "assistant/attempt", "agent/request-error", "tool/call",
        "tool/dispatch", "tool/result", "effect/receipt", "speech/played", "turn/end",
    }
    assert design_types <= EVENT_TYPES
    assert SURFACE_TYPES == {"user/message", "assistant/message", "tool/result"}
    assert ev.TURN_OUTCOMES == {"completed", "aborted", "interrupted", "error"}


def test_encode_payload_is_compact_json_and_keeps_unicode():
    text = encode_payload({"content": "café ☕", "n": [1, 2.5, None, True]})
    assert json.loads(text) == {"content": "café ☕", "n": [1, 2.5, None, True]}
    assert "café ☕" in text  # not \u-escaped
    assert " " not in text.replace("café ☕", "")


@pytest.mark.parametrize("bad", [{"s": {1, 2}}, {"x": float("nan")}, {"x": float("inf")}, {"o": object()}])
def test_encode_payload_refuses_non_json(bad):
    with pytest.raises(ValueError, match="not JSON"):
        encode_payload(bad)


def test_event_to_json_has_every_column():
    e = Event(3, "c-1", 2, 1, 0, ev.USER_MESSAGE, {"content": "hi"}, 1.5, 1700000000.0)
    assert e.to_json() == {
        "seq": 3, "conversation": "c-1", "turn": 2, "step": 1, "attempt": 0, "type": "user/message",
        "payload": {"content": "hi"}, "at_mono": 1.5, "at_wall": 1700000000.0,
    }


# --- append and read ----------------------------------------------------------


# (These tests wrote rows through the untyped `EventStore.append`, removed in
# #25: each records the body of the same payload now, `record` being the one
# recording path; what they check of the store is unchanged.)


def test_append_then_read_back(store: EventStore):
    mono0, wall0 = time.monotonic(), time.time()
    payloads = [
        (ev.USER_MESSAGE, {"content": "What time is it? ünïcode", "source": "text"}, 1, None, None),
        (ev.STEP_START, {"route": {"provider": "scripted", "model": "m", "base_url": None}}, 1, 0, None),
        (ev.ASSISTANT_MESSAGE, {"message_id": "", "content": [{"type": "text", "text": "Noon."}],
                                "stream": [[0.0, "text", "Noon."]]}, 1, 0, 2),
        (ev.STEP_END, {"outcome": "completed"}, 1, 0, 2),
    ]
    written = [store.record("c-a", ev.BODIES[t].from_payload(p), turn=tu, step=st, attempt=at)
               for t, p, tu, st, at in payloads]
    mono1, wall1 = time.monotonic(), time.time()

    read = store.events("c-a")
    assert read == written  # the returned Event equals what is read back
    seqs = [e.seq for e in read]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    for e, (t, p, tu, st, at) in zip(read, payloads):
        assert (e.conversation, e.type, e.payload, e.turn, e.step, e.attempt) == ("c-a", t, p, tu, st, at)
        assert mono0 <= e.at_mono <= mono1
        assert wall0 - 1 <= e.at_wall <= wall1 + 1
    assert store.last_seq() == seqs[-1]


def test_append_without_payload_stores_an_empty_object(store: EventStore):
    e = store.record("c-a", ev.StepStart())  # a body with nothing given
    assert e.payload == {}
    assert store.events("c-a")[0].payload == {}
    assert (e.turn, e.step, e.attempt) == (None, None, None)


def test_filters_types_turn_after_seq_and_conversation(store: EventStore):
    t1 = store.start_turn("c-a", ev.TurnStart(source="text"))
    store.record("c-a", ev.UserMessage(content="one"), turn=t1)
    store.record("c-a", ev.StepStart(), turn=t1, step=0, attempt=0)
    store.end_turn("c-a", t1, ev.COMPLETED)
    t2 = store.start_turn("c-b", ev.TurnStart(source="text"))
    store.record("c-b", ev.UserMessage(content="two"), turn=t2)
    t3 = store.start_turn("c-a", ev.TurnStart(source="voice"))
    store.record("c-a", ev.UserMessage(content="three"), turn=t3)

    users = store.events(types={ev.USER_MESSAGE})
    assert [e.payload["content"] for e in users] == ["one", "two", "three"]
    assert [e.payload["content"] for e in store.events("c-a", types={ev.USER_MESSAGE})] == ["one", "three"]
    starts_and_ends = store.events("c-a", types={ev.TURN_START, ev.TURN_END})
    assert [(e.type, e.turn) for e in starts_and_ends] == [
        (ev.TURN_START, t1), (ev.TURN_END, t1), (ev.TURN_START, t3)
    ]
    assert {e.turn for e in store.events(turn=t1)} == {t1}
    assert [e.type for e in store.events(turn=t1)] == [ev.TURN_START, ev.USER_MESSAGE, ev.STEP_START, ev.TURN_END]
    assert store.events("c-b", turn=t1) == []

    everything = store.events()
    cut = everything[3].seq
    after = store.events(after_seq=cut)
    assert after == everything[4:]
    assert all(e.seq > cut for e in after)
    assert store.events(after_seq=store.last_seq()) == []
    assert store.events("c-a", after_seq=cut, types={ev.USER_MESSAGE}) == [
        e for e in everything[4:] if e.conversation == "c-a" and e.type == ev.USER_MESSAGE
    ]


@pytest.mark.parametrize("bad", [{"tags": {"a", "b"}}, {"x": float("nan")}, {"when": time}])
def test_non_json_payload_raises_and_writes_nothing(store: EventStore, bad):
    store.record("c-a", ev.UserMessage(content="kept"))
    before = store.events()
    with pytest.raises(ValueError):
        store.record("c-a", ev.UserMessage(content="x", audio=bad), turn=1)  # (a field that is not JSON)
    assert store.events() == before
    # and the connection is still usable afterwards
    e = store.record("c-a", ev.UserMessage(content="after"))
    assert e.seq > before[-1].seq


def test_non_json_payload_in_start_turn_writes_nothing(store: EventStore):
    with pytest.raises(ValueError):
        store.start_turn("c-a", ev.TurnStart(source=float("nan")))
    assert store.events() == []
    assert store.start_turn("c-a", ev.TurnStart()) == 1  # no transaction left open


def test_unknown_event_type_raises(store: EventStore):
    # (A type is a body's now: what is not a registered body is refused.)
    class Finish(ev.Body):
        TYPE = ""  # a base, never registered

    with pytest.raises(ValueError, match="not an event body"):
        store.record("c-a", Finish())
    assert store.events() == []


# --- turns --------------------------------------------------------------------


def test_start_turn_allocates_increasing_ids_across_conversations(store: EventStore):
    a1 = store.start_turn("c-a", ev.TurnStart(source="text"))
    b1 = store.start_turn("c-b", ev.TurnStart(source="voice"))
    a2 = store.start_turn("c-a", ev.TurnStart(source="text"))
    assert a1 < b1 < a2
    assert (a1, b1, a2) == (1, 2, 3)
    starts = store.events(types={ev.TURN_START})
    assert [(e.conversation, e.turn, e.payload) for e in starts] == [
        ("c-a", 1, {"source": "text"}), ("c-b", 2, {"source": "voice"}), ("c-a", 3, {"source": "text"})
    ]
    # a turn id used by another event type also counts
    store.record("c-c", ev.UserMessage(content="x"), turn=10)
    assert store.start_turn("c-c", ev.TurnStart()) == 11


def test_end_turn_twice_keeps_the_first_outcome(store: EventStore):
    turn = store.start_turn("c-a", ev.TurnStart())
    assert store.end_turn("c-a", turn, ev.ABORTED, reason="stop") is True
    assert store.end_turn("c-a", turn, ev.COMPLETED) is False
    ends = _turn_ends(store, "c-a", turn)
    assert len(ends) == 1
    assert ends[0].payload == {"outcome": "aborted", "reason": "stop"}


def test_raw_second_turn_end_raises_duplicate(store: EventStore):
    turn = store.start_turn("c-a", ev.TurnStart())
    store.record("c-a", ev.TurnEnd(outcome=ev.COMPLETED), turn=turn)
    before = store.events()
    with pytest.raises(DuplicateTurnEnd):
        store.record("c-a", ev.TurnEnd(outcome=ev.ERROR), turn=turn)
    assert store.events() == before


def test_same_turn_id_in_two_conversations_may_each_end_once(store: EventStore):
    turn = store.start_turn("c-a", ev.TurnStart())
    store.copy_events(store.events("c-a"), "c-fork")
    assert store.end_turn("c-a", turn, ev.COMPLETED) is True
    assert store.end_turn("c-fork", turn, ev.ABORTED) is True
    assert store.end_turn("c-fork", turn, ev.COMPLETED) is False
    assert [e.payload["outcome"] for e in _turn_ends(store, "c-a", turn)] == ["completed"]
    assert [e.payload["outcome"] for e in _turn_ends(store, "c-fork", turn)] == ["aborted"]


def test_turn_end_race_across_two_connections(db_path: Path):
    """Two processes (here two connections) ending the same turn: one wins."""
    a, b = EventStore(db_path), EventStore(db_path)
    try:
        turn = a.start_turn("c-a", ev.TurnStart())
        assert a.end_turn("c-a", turn, ev.ABORTED) is True
        assert b.end_turn("c-a", turn, ev.COMPLETED) is False
        assert [e.payload["outcome"] for e in _turn_ends(b, "c-a", turn)] == ["aborted"]
    finally:
        a.close()
        b.close()


def test_open_turns(store: EventStore):
    assert store.open_turns() == []
    t1 = store.start_turn("c-a", ev.TurnStart())
    t2 = store.start_turn("c-b", ev.TurnStart())
    t3 = store.start_turn("c-a", ev.TurnStart())
    assert store.open_turns() == [("c-a", t1), ("c-b", t2), ("c-a", t3)]
    store.end_turn("c-a", t1, ev.COMPLETED)
    assert store.open_turns() == [("c-b", t2), ("c-a", t3)]
    assert store.open_turns("c-a") == [("c-a", t3)]
    assert store.open_turns("c-b") == [("c-b", t2)]
    store.end_turn("c-b", t2, ev.INTERRUPTED)
    store.end_turn("c-a", t3, ev.ERROR)
    assert store.open_turns() == []
    # a turn/end in one conversation does not close the same turn id in another
    store.copy_events(store.events("c-a", types={ev.TURN_START}), "c-copy")
    assert store.open_turns("c-copy") == [("c-copy", t1), ("c-copy", t3)]


# --- append-only, WAL, durability ---------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE events SET payload = '{}'",
        "UPDATE events SET type = 'turn/start' WHERE type = 'turn/end'",
        "DELETE FROM events",
        "DELETE FROM events WHERE type = 'turn/end'",
    ],
)
def test_log_is_append_only(store: EventStore, sql: str):
    turn = store.start_turn("c-a", ev.TurnStart(source="text"))
    store.record("c-a", ev.UserMessage(content="hello"), turn=turn)
    store.end_turn("c-a", turn, ev.COMPLETED)
    before = store.events()
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store._db.execute(sql)
    assert store.events() == before


def test_append_only_holds_for_another_connection(store: EventStore, db_path: Path):
    store.record("c-a", ev.UserMessage(content="hello"))
    con = _raw(db_path)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            con.execute("DELETE FROM events")
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            con.execute("UPDATE events SET conversation = 'x'")
        assert con.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 1
    finally:
        con.close()


def test_journal_mode_is_wal(store: EventStore, db_path: Path):
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    con = _raw(db_path)  # persistent: a fresh connection sees it too
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    finally:
        con.close()


def test_creates_parent_folders(tmp_path: Path):
    path = tmp_path / "a" / "b" / "c" / "events.db"
    s = EventStore(path)
    try:
        s.record("c-a", ev.UserMessage(content="x"))
    finally:
        s.close()
    assert path.exists()
    assert s.path == path


def test_reopen_keeps_events_and_continues_seq(db_path: Path):
    first = EventStore(db_path)
    t1 = first.start_turn("c-a", ev.TurnStart(source="text"))
    first.record("c-a", ev.UserMessage(content="before restart"), turn=t1)
    first.end_turn("c-a", t1, ev.COMPLETED)
    t2 = first.start_turn("c-a", ev.TurnStart())
    old = first.events()
    first.close()

    second = EventStore(db_path)
    try:
        assert second.events() == old
        assert second.open_turns() == [("c-a", t2)]
        e = second.record("c-a", ev.UserMessage(content="after restart"), turn=t2)
        assert e.seq > old[-1].seq
        assert second.start_turn("c-a", ev.TurnStart()) == t2 + 1
        assert second.end_turn("c-a", t1, ev.ERROR) is False  # still ended
        assert second._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        second.close()


def test_reopen_after_a_crash_without_close(db_path: Path):
    """A process that dies without close(): the next one sees every committed event."""
    crashed = EventStore(db_path)
    crashed.record("c-a", ev.UserMessage(content="committed"))
    # no close(): open a second store while the first connection still holds the WAL
    survivor = EventStore(db_path)
    try:
        assert [e.payload for e in survivor.events()] == [{"content": "committed"}]
    finally:
        survivor.close()
        crashed.close()


# --- schema versions ------------------------------------------------------------

_OLD_TABLE = """
CREATE TABLE events (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation TEXT    NOT NULL,
    turn         INTEGER,
    step         INTEGER,
    attempt      INTEGER,
    type         TEXT    NOT NULL,
    payload      TEXT    NOT NULL,
    at_mono      REAL    NOT NULL,
    at_wall      REAL    NOT NULL
)
"""


def test_opening_an_old_database_migrates_it(tmp_path: Path):
    path = tmp_path / "old.db"
    con = _raw(path)
    con.execute(_OLD_TABLE)
    con.execute(
        "INSERT INTO events(conversation, turn, step, attempt, type, payload, at_mono, at_wall)"
        " VALUES ('c-old', 1, NULL, NULL, 'turn/end', '{\"outcome\":\"completed\"}', 10.0, 1600000000.0)"
    )
    con.execute(
        "INSERT INTO events(conversation, turn, step, attempt, type, payload, at_mono, at_wall)"
        " VALUES ('c-old', 2, NULL, NULL, 'turn/end', '{\"outcome\":\"aborted\"}', 11.0, 1600000001.0)"
    )
    assert con.execute("PRAGMA user_version").fetchone()[0] == 0
    con.close()

    store = EventStore(path)
    try:
        rows = store.events()
        assert [(e.seq, e.conversation, e.turn, e.type, e.payload, e.at_mono, e.at_wall) for e in rows] == [
            (1, "c-old", 1, "turn/end", {"outcome": "completed"}, 10.0, 1600000000.0),
            (2, "c-old", 2, "turn/end", {"outcome": "aborted"}, 11.0, 1600000001.0),
        ]
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        # the unique index now refuses a duplicate turn/end
        with pytest.raises(DuplicateTurnEnd):
            store.record("c-old", ev.TurnEnd(outcome="error"), turn=1)
        assert store.end_turn("c-old", 2, ev.COMPLETED) is False
        # the triggers are in place
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            store._db.execute("DELETE FROM events")
        # and it keeps working: new turns continue after the old ids
        assert store.start_turn("c-old", ev.TurnStart()) == 3
        assert store.end_turn("c-old", 3, ev.COMPLETED) is True
        assert len(store.events()) == 4
    finally:
        store.close()

    again = EventStore(path)  # a second open does not migrate twice or fail
    try:
        assert again._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert len(again.events()) == 4
    finally:
        again.close()


def test_newer_database_is_refused_naming_upgrade(tmp_path: Path):
    path = tmp_path / "new.db"
    con = _raw(path)
    con.execute(_OLD_TABLE)
    con.execute(
        "INSERT INTO events(conversation, turn, step, attempt, type, payload, at_mono, at_wall)"
        " VALUES ('c-new', 1, NULL, NULL, 'turn/start', '{}', 1.0, 1.0)"
    )
    con.execute("PRAGMA user_version = 99")
    con.close()
    with pytest.raises(ValueError, match="upgrade") as info:
        EventStore(path)
    assert "99" in str(info.value)
    con = _raw(path)
    try:
        assert con.execute("PRAGMA user_version").fetchone()[0] == 99
        assert con.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 1
    finally:
        con.close()


def test_corrupt_file_raises_value_error(tmp_path: Path):
    path = tmp_path / "corrupt.db"
    path.write_bytes(random.Random(1234).randbytes(16384))
    with pytest.raises(ValueError, match="cannot open the event log") as info:
        EventStore(path)
    assert str(path) in str(info.value)


def test_text_file_is_not_a_database(tmp_path: Path):
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 200)
    with pytest.raises(ValueError):
        EventStore(path)
    assert path.read_text().startswith("these are my notes")


# --- conversations ----------------------------------------------------------------


def test_conversations_latest_and_of_turn(store: EventStore):
    assert store.conversations() == []
    assert store.latest_conversation() is None
    assert store.conversations_of_turn(1) == []

    t1 = store.start_turn("c-b", ev.TurnStart())
    t2 = store.start_turn("c-a", ev.TurnStart())
    assert store.conversations() == ["c-b", "c-a"]  # oldest first, not alphabetical
    assert store.latest_conversation() == "c-a"
    store.record("c-b", ev.UserMessage(content="later"), turn=t1)
    assert store.latest_conversation() == "c-b"
    assert store.conversations() == ["c-b", "c-a"]

    assert store.conversations_of_turn(t1) == ["c-b"]
    assert store.conversations_of_turn(t2) == ["c-a"]
    store.copy_events(store.events("c-b"), "c-fork")
    assert store.conversations_of_turn(t1) == ["c-b", "c-fork"]
    assert store.conversations() == ["c-b", "c-a", "c-fork"]
    assert store.latest_conversation() == "c-fork"


def test_copy_events_keeps_turn_ids_and_payloads(store: EventStore):
    t1 = store.start_turn("c-a", ev.TurnStart(source="text"))
    store.record("c-a", ev.UserMessage(content="hello"), turn=t1)
    store.record("c-a", ev.AssistantMessage(content=[{"type": "text", "text": "Hi."}]), turn=t1, step=0, attempt=1)
    store.end_turn("c-a", t1, ev.COMPLETED)
    t2 = store.start_turn("c-a", ev.TurnStart(source="text"))
    store.record("c-a", ev.UserMessage(content="second"), turn=t2)
    original = store.events("c-a")

    keep = [e for e in original if e.turn == t1]
    store.copy_events(keep, "c-fork")
    copied = store.events("c-fork")
    assert len(copied) == len(keep)
    for old, new in zip(keep, copied):
        assert new.conversation == "c-fork"
        assert new.seq > original[-1].seq
        assert (new.turn, new.step, new.attempt, new.type, new.payload, new.at_mono, new.at_wall) == (
            old.turn, old.step, old.attempt, old.type, old.payload, old.at_mono, old.at_wall
        )
    assert store.events("c-a") == original  # the source is untouched
    assert store.open_turns("c-fork") == []
    # the copy's turn/end counts: the fork cannot end turn 1 again
    assert store.end_turn("c-fork", t1, ev.ABORTED) is False


def test_copy_events_is_all_or_nothing(store: EventStore):
    t1 = store.start_turn("c-a", ev.TurnStart())
    store.end_turn("c-a", t1, ev.COMPLETED)
    events = store.events("c-a")
    # copying the turn/end twice into one conversation violates the unique index
    with pytest.raises(sqlite3.IntegrityError):
        store.copy_events(events + events, "c-fork")
    assert store.events("c-fork") == []
    store.copy_events(events, "c-fork")  # no transaction left open
    assert len(store.events("c-fork")) == len(events)


def test_new_conversation_ids_are_distinct():
    ids = {new_conversation_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(i.startswith("c-") for i in ids)
