"""Commands that read a log (history, show, trace, effects, and fork, which
writes into one that must exist) as real subprocesses: a log someone sent
you is read as it came, never migrated, tightened or given a -wal beside
it; a mistyped --db is "no such log", never a new empty one; and `voice
show` checks where it writes before it writes anything."""

from __future__ import annotations

import os
import re
import sqlite3
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from show_log import write_turn
from test_service import env_for, voice
from voice.log.schema import MIGRATIONS

pytestmark = pytest.mark.timeout(180)

READERS = (("history",), ("trace", "1"), ("effects",), ("show", "1", "--out", "{tmp}/t.html"))


def as_schema_3(db: Path) -> None:
    """The log as voice wrote it before issue #14's indexes (schema 4)."""
    added = re.findall(r"CREATE INDEX IF NOT EXISTS (\w+)", MIGRATIONS[4])  # what migration 4 adds
    with sqlite3.connect(db) as c:
        c.executescript("".join(f"DROP INDEX {name};" for name in added) + "PRAGMA user_version = 3;")
        c.execute("PRAGMA journal_mode = DELETE")  # at rest, as a log that was sent arrives
    c.close()


def folder_as_it_is(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in sorted(folder.iterdir())}


def test_reading_an_older_log_changes_nothing_of_it(tmp_path):
    write_turn(tmp_path / "sent")
    db = tmp_path / "sent" / "events.db"
    as_schema_3(db)
    os.chmod(db, 0o644)  # as it arrived in an email
    before = folder_as_it_is(db.parent)
    for command in READERS:
        done = voice(tmp_path, *(a.format(tmp=tmp_path) for a in command), "--db", str(db))
        assert done.returncode == 0, (command, done.stderr)
        assert folder_as_it_is(db.parent) == before, command  # same bytes, same mode, no -wal or -shm
    assert "Let me note that" in voice(tmp_path, "history", "--db", str(db)).stdout  # read as it is
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        assert c.execute("PRAGMA user_version").fetchone() == (3,)
    c.close()


@pytest.mark.parametrize("command", [*READERS, ("fork", "1")], ids=lambda c: c[0])
def test_a_mistyped_db_is_no_such_log_and_creates_nothing(tmp_path, command):
    db = tmp_path / "nope" / "events.db"
    done = voice(tmp_path, *(a.format(tmp=tmp_path) for a in command), "--db", str(db))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"voice: error: no such log: {db}"), line
    assert not (tmp_path / "nope").exists() and not (tmp_path / "t.html").exists()


@pytest.mark.parametrize("payload", ['{"a":', "[1, 2, 3]", "{}"], ids=["not-json", "not-an-object", "empty"])
def test_a_row_damaged_outside_voice_is_one_line_naming_it_and_the_log_is_left_as_it_is(tmp_path, payload):
    """Found by a hostile tester: a payload changed in place (the integrity
    check still says ok) gave each reader a traceback. Now: which row, and
    what to do; nothing of the log changed."""
    write_turn(tmp_path / "log")
    db = tmp_path / "log" / "events.db"
    with sqlite3.connect(db) as c:  # voice's triggers forbid this; someone with sqlite3 did it anyway
        seq, type_ = c.execute("SELECT seq, type FROM events WHERE turn = 1 ORDER BY seq LIMIT 1 OFFSET 1").fetchone()
        c.executescript(f"DROP TRIGGER events_no_update; UPDATE events SET payload = '{payload}' WHERE seq = {seq};")
    c.close()
    before = folder_as_it_is(db.parent)
    for command in READERS:
        done = voice(tmp_path, *(a.format(tmp=tmp_path) for a in command), "--db", str(db))
        assert "Traceback" not in done.stderr, (command, done.stderr)
        if done.returncode == 0 and command[0] in ("trace", "effects"):
            continue  # they read only some types of rows, and this one is not among them
        assert done.returncode == 2, (command, done.stderr)
        (line,) = done.stderr.splitlines()
        assert line.startswith(f"voice: error: the log has a damaged row: event {seq} ({type_}) ") and line.endswith(
            "it was changed outside voice: restore it from a backup, or give another log with --db"), line
        assert folder_as_it_is(db.parent) == before, command
    assert not (tmp_path / "t.html").exists()
    forked = voice(tmp_path, "fork", "1", "--db", str(db))  # it writes into the log: the same line, nothing added
    assert forked.returncode == 2 and forked.stderr.startswith(
        f"voice: error: the log has a damaged row: event {seq} ({type_}) "), forked.stderr
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        assert c.execute("SELECT COUNT(DISTINCT conversation) FROM events").fetchone() == (1,)
    c.close()


def test_a_log_cut_short_says_what_to_do_and_is_left_as_it_is(tmp_path):
    """Found by a hostile tester: a log cut to its first kilobyte said only
    "database disk image is malformed"."""
    write_turn(tmp_path / "log")
    db = tmp_path / "log" / "events.db"
    with sqlite3.connect(db) as c:
        c.execute("PRAGMA journal_mode = DELETE")  # at rest: all in one file
    c.close()
    db.write_bytes(db.read_bytes()[:1024])
    before = folder_as_it_is(db.parent)
    for command in READERS:
        done = voice(tmp_path, *(a.format(tmp=tmp_path) for a in command), "--db", str(db))
        assert (done.returncode, done.stderr) == (2, f"voice: error: cannot open the event log {db}: database disk "
                                                     "image is malformed: restore it from a backup, or move it aside "
                                                     "to start a new one\n"), (command, done.stderr)
        assert folder_as_it_is(db.parent) == before, command


def test_show_checks_both_outputs_before_writing_either(tmp_path):
    write_turn(tmp_path / "log")
    page, png = tmp_path / "t.html", tmp_path / "missing" / "t.png"
    done = voice(tmp_path, "show", "1", "--db", str(tmp_path / "log" / "events.db"), "--out", str(page),
                 "--png", str(png))
    assert (done.returncode, done.stderr.strip()) == (2, f"voice: error: cannot write {png}: No such file or directory")
    assert not page.exists()  # not a page without the PNG that was asked for beside it


def test_show_of_a_turn_without_a_recording_has_a_real_time_axis_and_no_warning(tmp_path):
    db = tmp_path / "typed.db"
    said = subprocess.run([sys.executable, "-m", "voice", "chat", "--db", str(db)], input="what time is it\n",
                          env=env_for(tmp_path), capture_output=True, text=True, timeout=60)
    assert said.returncode == 0, said.stderr
    done = voice(tmp_path, "show", "1", "--db", str(db), "--out", str(tmp_path / "t.html"))
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr  # matplotlib's "identical low and high xlims"

    from voice.log.store import EventStore
    from voice.show.load import from_store

    store = EventStore(db, read_only=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            timeline = from_store(store, store.conversations()[0], 1)
    finally:
        store.close()
    assert timeline.window.end_s - timeline.window.start_s >= 1.0  # seconds, not -0.04..0.04
