"""The durable, append-only event log: SQLite in WAL mode.

Invariants the database itself enforces:
- rows are never updated or deleted (triggers abort such statements);
- each (conversation, turn) has at most one `turn/end` (a partial unique
  index), so a stop racing a completion yields one terminal outcome;
- each tool call (conversation, turn, step, id) has at most one result and
  one receipt per phase.

Durability: an append is one INSERT + COMMIT. Most commits run with
synchronous=NORMAL (durable against a process crash, not an OS crash); the
events an effect in the world depends on (`DURABLE_TYPES`: a dispatch, a
receipt, a timer, a turn's end) commit with synchronous=FULL, which fsyncs
the WAL and with it every event before them, so after an OS crash no effect
exists without its dispatch on disk. benchmarks/log_append.py measures both.

Opening checks the log before anything is written (see `_open`): a path that
cannot hold a log, a damaged database or write-ahead log are refused with
one line naming the problem, and a copy of the files as found is kept.
The log and its -wal/-shm are private to the user (0600).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from voice.errors import as_usage_error
from voice.log.events import (
    BODIES,
    DURABLE_TYPES,
    TURN_END,
    Body,
    Event,
    RuntimeRecovery,
    TurnEnd,
    TurnStart,
    UNSET,
    encode_payload,
)
from voice.log.feed import DEFAULT_BUFFER, EventFeed, Subscription
from voice.log.queries import EventQueries
from voice.log.schema import BASE_TABLE, MIGRATIONS, SCHEMA_VERSION
from voice.log.wal import find_damage, in_use
from voice.settings import PathsSettings


class DuplicateTerminal(Exception):
    """A second terminal event (tool result, receipt) for one tool call was
    refused by the database."""


class DuplicateTurnEnd(DuplicateTerminal):
    """A second `turn/end` for the same turn was refused by the database."""


class LogDamaged(ValueError):
    """The log's files are damaged; a copy as found was kept (`copy`)."""

    def __init__(self, message: str, copy: Path):
        super().__init__(message)
        self.copy = copy


_INSERT = ("INSERT INTO events(conversation, turn, step, attempt, type, payload, at_mono, at_wall)"
           " VALUES (?,?,?,?,?,?,?,?)")


class EventStore(EventQueries):
    """Record and read events. One instance per process; safe to use from
    the event loop thread (a record is well under a millisecond, one of
    `DURABLE_TYPES` with its fsync too: see `_insert`).

    Writers record typed bodies: `record(conversation, body, turn=, step=,
    attempt=)`, the one recording path (each body is built by one writer
    module, tests/test_architecture.py). Every committed row is also handed
    to the store's subscribers (`subscribe()`). The reading half is
    `EventQueries` (voice.log.queries); the schema is voice.log.schema."""

    def __init__(self, path: str | Path, *, read_only: bool = False):
        """`read_only`: for commands that only read (history, show, trace,
        effects): the log must exist, and nothing of it is changed, not its
        schema (an older one reads as it is: each step only added indexes
        and checks), not its mode; a log someone sent you stays as it came."""
        self.path = Path(path)
        self.feed = EventFeed()
        self.read_only = read_only
        if read_only:
            self._db = _open_read_only(self.path)
        else:
            _prepare(self.path)
            self._db = _open(self.path)
        try:
            self._check_version()
            if read_only:
                self._check_integrity()
                if not self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'events'").fetchone():
                    raise ValueError(f"{self.path} is not an event log (it has no events)")
            else:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute("PRAGMA busy_timeout=5000")
                self._check_integrity()
                self._migrate()
                _make_private(self.path)  # the -wal and -shm exist from here on
        except (sqlite3.DatabaseError, ValueError) as exc:
            self._db.close()
            if isinstance(exc, ValueError):
                raise
            raise ValueError(_unreadable(self.path, exc)) from exc

    def _check_integrity(self) -> None:
        """A damaged page is found now, with one clear line, not later as a
        traceback in the middle of a turn. quick_check reads every page
        (benchmarks/log_append.py measures it on a large log)."""
        problems = [r[0] for r in self._db.execute("PRAGMA quick_check(3)")]
        if problems != ["ok"]:
            copy = _keep_copy(self.path)
            found = "; ".join(" ".join(p.split()) for p in problems)  # one line
            raise LogDamaged(f"the event log {self.path} is damaged ({found}); a copy as found is in "
                             f"{copy}: move the log aside to start a new one, or recover rows with "
                             f"`sqlite3 {copy / self.path.name} .recover`", copy)

    def _check_version(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"the event log {self.path} has schema version {version}, newer than this "
                f"program's {SCHEMA_VERSION}: upgrade voice"
            )

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        self._db.executescript(BASE_TABLE)
        for target in range(version + 1, SCHEMA_VERSION + 1):
            self._db.executescript("BEGIN;" + MIGRATIONS[target] + f"PRAGMA user_version={target}; COMMIT;")

    def close(self) -> None:
        self.feed.close()
        self._db.close()

    def subscribe(self, max_buffer: int = DEFAULT_BUFFER) -> Subscription:
        """Every event committed from now on (see voice.log.feed), as a
        context manager: `with store.subscribe() as events: async for ...`."""
        return self.feed.subscribe(max_buffer)

    # -- writing -----------------------------------------------------------

    def record(
        self,
        conversation: str,
        body: Body,
        *,
        turn: int | None = None,
        step: int | None = None,
        attempt: int | None = None,
    ) -> Event:
        """Commit one event. Raises DuplicateTerminal (DuplicateTurnEnd) when
        the database refuses a second terminal event for a call (a turn)."""
        if BODIES.get(body.TYPE) is not type(body):
            raise ValueError(f"not an event body: {body!r}")
        event = self._insert(conversation, body.TYPE, body.payload(), turn, step, attempt)
        event.__dict__["_body"] = body  # (what `Event.body` would parse back)
        self.feed.publish(event)
        return event

    def record_recovery(self, conversation: str, **what: Any) -> Event:
        """The one writer of `runtime/recovery` (the fields of
        `RuntimeRecovery`): what start-up recovery closed or reconciled. (What
        a damaged log lost is written by `_open`, here too, before the store
        is open.)"""
        return self.record(conversation, RuntimeRecovery(**what))

    def _insert(self, conversation: str, type: str, payload: dict[str, Any], turn: int | None, step: int | None,
                attempt: int | None) -> Event:
        text = encode_payload(payload)
        at_mono, at_wall = time.monotonic(), time.time()
        durable = type in DURABLE_TYPES
        # This commit runs on the caller's thread, the event loop's, on purpose
        # (#25, measured with benchmarks/log_append.py --n 1000): a durable one
        # (fsync) blocks it 0.18 ms p50, 0.26 ms p95, 0.43 ms p99; an ordinary
        # one 0.07 / 0.13 / 0.18 ms. A mic block commits no durable event (at
        # most an ordinary speech/*, listen/* or audio/clock row); a turn
        # commits one (its turn/end) plus one per read call and two per write
        # (dispatch, receipt): a turn with a write, 13 rows and 3 fsyncs, 2.0 ms
        # p95 in all. Well under a 20 ms mic block, so no worker thread: it
        # would cost a thread hop per row and make every writer await.
        if durable:  # this commit fsyncs the WAL: it and everything before it survive an OS crash
            self._db.execute("PRAGMA synchronous=FULL")
        try:
            cur = self._db.execute(
                _INSERT,
                (conversation, turn, step, attempt, type, text, at_mono, at_wall),
            )
        except sqlite3.IntegrityError as exc:
            if type == TURN_END:
                raise DuplicateTurnEnd(f"turn {turn} of {conversation} already ended") from exc
            raise DuplicateTerminal(f"{type} for {payload.get('tool_call_id')} of {conversation} "
                                    f"(turn {turn}, step {step}) already recorded") from exc
        finally:
            if durable:
                self._db.execute("PRAGMA synchronous=NORMAL")
        return Event(cur.lastrowid, conversation, turn, step, attempt, type, payload, at_mono, at_wall)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """Several rows as one commit: all of them, or (on any error or a
        cancel) none."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def start_turn(self, conversation: str, start: TurnStart) -> int:
        """Allocate a new turn id (global, increasing) and log `turn/start`."""
        payload = start.payload()
        at_mono, at_wall = time.monotonic(), time.time()
        with self._transaction():
            (last,) = self._db.execute("SELECT COALESCE(MAX(turn), 0) FROM events").fetchone()
            turn = last + 1
            cur = self._db.execute(
                _INSERT,
                (conversation, turn, None, None, TurnStart.TYPE, encode_payload(payload), at_mono, at_wall),
            )
        self.feed.publish(Event(cur.lastrowid, conversation, turn, None, None, TurnStart.TYPE, payload, at_mono, at_wall))
        return turn

    def end_turn(self, conversation: str, turn: int, outcome: str, *, reason: str = UNSET,
                 error: str = UNSET) -> bool:
        """Log the turn's one terminal outcome. Returns False (and writes
        nothing) when the turn had already ended: the first outcome wins."""
        try:
            self.record(conversation, TurnEnd(outcome=outcome, reason=reason, error=error), turn=turn)
        except DuplicateTurnEnd:
            return False
        return True

    def copy_events(self, events: list[Event], conversation: str) -> None:
        """Copy events into another conversation (forks), keeping their ids,
        payloads and times, in one transaction."""
        copies = []
        with self._transaction():
            for e in events:
                cur = self._db.execute(
                    _INSERT,
                    (conversation, e.turn, e.step, e.attempt, e.type, encode_payload(e.payload), e.at_mono, e.at_wall),
                )
                copies.append(Event(cur.lastrowid, conversation, e.turn, e.step, e.attempt, e.type, e.payload,
                                    e.at_mono, e.at_wall))
        for copy in copies:
            self.feed.publish(copy)



def new_conversation_id() -> str:
    return "c-" + uuid.uuid4().hex[:10]


# -- opening -----------------------------------------------------------------


def _prepare(path: Path) -> None:
    """Make sure `path` can hold a log, or say in one line why not. A new
    log and its folder are created private (0600, 0700)."""
    if path.is_dir():
        raise ValueError(f"the event log {path} is a directory, not a file: name a file in it, e.g. {path / 'events.db'}")
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise ValueError(f"cannot create the event log {path}: {blocker} is a file, not a directory")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError as exc:
        raise ValueError(f"cannot create the event log {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(path.stat().st_mode):
        raise ValueError(f"the event log {path} is not a regular file")
    _make_private(path)


def _make_private(path: Path) -> None:
    """The log holds utterances, notes and command output: user-only. Logs
    written by earlier versions (0644) are tightened too."""
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            if stat.S_IMODE(name.stat().st_mode) & 0o077:
                os.chmod(name, 0o600)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ValueError(f"cannot make the event log {name} private (chmod 600): {exc.strerror or exc}") from None


def _open(path: Path) -> sqlite3.Connection:
    """Connect, after checking what SQLite's WAL recovery would drop. When
    committed events would be lost, a copy of the files as found is kept,
    the readable part is checkpointed (so the next start continues from
    it) and the loss is said, once, in one line and in the log itself."""
    damage = None if in_use(path) else find_damage(path)
    copy = _keep_copy(path) if damage is not None else None
    try:
        db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise ValueError(f"cannot open the event log {path}: {exc}") from None
    if damage is None or copy is None:
        return db
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'events'").fetchone():
            last = db.execute("SELECT conversation FROM events ORDER BY seq DESC LIMIT 1").fetchone()
            db.execute(
                _INSERT,
                (last[0] if last else "", None, None, None, RuntimeRecovery.TYPE,
                 encode_payload(RuntimeRecovery(log_damage=damage.reason, lost_commits=damage.lost_commits,
                                                copy=str(copy)).payload()),
                 time.monotonic(), time.time()),
            )
    finally:
        db.close()
    raise LogDamaged(f"the event log {path} was damaged: {damage.reason}; the files as found are kept in {copy}, "
                     "and the next start continues from what was readable", copy)


def _unreadable(path: Path, exc: sqlite3.DatabaseError) -> str:
    """The one line for a log SQLite cannot read at all (cut short, overwritten)."""
    return (f"cannot open the event log {path}: {exc}: restore it from a backup, or move it aside to start "
            f"a new one")


def _open_read_only(path: Path) -> sqlite3.Connection:
    """Connect without the right to write: a missing log is "no such log"
    (never a new empty one), and a damaged write-ahead log is said, not
    repaired (a command that writes does that, keeping a copy)."""
    if path.is_dir():
        raise ValueError(f"the event log {path} is a directory, not a file: name a file in it, e.g. {path / 'events.db'}")
    if not path.is_file():
        raise ValueError(f"no such log: {path} (check the path; voice chat or voice run --db {path} starts a new one)")
    damage = None if in_use(path) else find_damage(path)
    if damage is not None:
        raise ValueError(f"the event log {path} has a damaged write-ahead log ({damage.reason}); reading it would "
                         f"drop events: run `voice chat --db {path}` once, which keeps a copy and continues from "
                         "what is readable")
    # Without a write-ahead log (a log at rest: closed cleanly, or sent by
    # someone) it is read as an immutable file: a read-only connection would
    # still leave an empty -wal and a -shm beside it. With one (a service is
    # writing it now), the -shm is how readers see its newest commits.
    mode = "mode=ro" if Path(f"{path}-wal").exists() else "mode=ro&immutable=1"
    try:
        return sqlite3.connect(f"{path.resolve().as_uri()}?{mode}", uri=True, isolation_level=None,
                               check_same_thread=False)
    except sqlite3.Error as exc:
        raise ValueError(f"cannot open the event log {path}: {exc}") from None


def _keep_copy(path: Path) -> Path:
    """Copy the log's files, as found, into a private folder beside it,
    named by the log's last change: the same damage found again (a service
    restarted in a loop) reuses the copy instead of piling them up."""
    files = [p for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()]
    stamp = int(path.stat().st_mtime)
    copy = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S', time.localtime(stamp))}")
    copy.mkdir(mode=0o700, exist_ok=True)
    for p in files:
        if not (copy / p.name).exists():
            shutil.copy2(p, copy / p.name)
    return copy


def open_store(paths: PathsSettings, db: str | Path | None = None, *, read_only: bool = False) -> EventStore:
    """The event log at `db`, else the config's, else the XDG default; a log
    that cannot be opened is one line naming the file and the fix.
    `read_only`: see EventStore (the commands that only read)."""
    path = paths.db_path(db)
    with as_usage_error(ValueError):
        return EventStore(path, read_only=read_only)
