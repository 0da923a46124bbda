"""Issue #11, finding 5: a log that does not lose data quietly. A dispatch
is on disk before its effect starts; a damaged log or write-ahead log is
found at start, said in one line with a copy of the files as found, never
turned into a silent fresh log; a --db that cannot be a log is one line."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from voice.log import events as ev
from voice.log.store import EventStore

ROOT = Path(__file__).resolve().parents[1]
FRAME = 24 + 4096  # a WAL frame of the log's 4 KiB pages


def env_for(tmp: Path) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(tmp / "state"), "XDG_DATA_HOME": str(tmp / "data"),
            "XDG_CONFIG_HOME": str(tmp / "config"), "HF_HUB_OFFLINE": "1"}


def voice(tmp: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voice", *args], cwd=ROOT, env=env_for(tmp), input=stdin,
                          capture_output=True, text=True, timeout=60)


def one_line_error(out: subprocess.CompletedProcess, *needles: str) -> None:
    assert out.returncode != 0, out.stdout
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("voice: error: "), out.stderr
    assert "Traceback" not in out.stderr
    for needle in needles:
        assert needle in out.stderr, out.stderr


# -- durable dispatch ---------------------------------------------------------------------------


def _can_trace() -> bool:
    return shutil.which("strace") is not None and subprocess.run(
        ["strace", "-qq", "-o", "/dev/null", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_trace(), reason="needs strace, allowed to trace (ptrace)")
def test_the_dispatch_is_on_disk_before_the_effect_starts(tmp_path):
    """Traced system calls of a real run: the WAL is synced after the
    dispatch is written and before the notes file is opened."""
    script = tmp_path / "note.toml"
    script.write_text('[[reply]]\nchunk_delay_ms = 1\n[[reply.tool_calls]]\nname = "add_note"\n'
                      'arguments = { text = "buy milk" }\n[[reply]]\nchunk_delay_ms = 1\ntext = "Saved."\n')
    trace = tmp_path / "trace"
    out = subprocess.run(["strace", "-f", "-y", "-qq", "-e", "trace=pwrite64,write,fsync,fdatasync,openat", "-o",
                          str(trace), sys.executable, "-m", "voice", "chat", "--db", str(tmp_path / "ev.db"),
                          "--llm", f"scripted:{script}"], cwd=ROOT, env=env_for(tmp_path), input="note\n",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    calls = trace.read_text().splitlines()
    effect = next(n for n, c in enumerate(calls) if "openat(" in c and "notes.txt" in c and "O_WRONLY" in c)
    wal = [n for n, c in enumerate(calls[:effect]) if "ev.db-wal>" in c]
    last_write = max(n for n in wal if "pwrite64(" in calls[n])
    assert any(re.search(r"\bf(data)?sync\(", calls[n]) for n in wal if n > last_write), \
        "the WAL holding the dispatch was not synced before the effect started"


# -- a damaged write-ahead log ------------------------------------------------------------------


@pytest.fixture(scope="module")
def crashed_log(tmp_path_factory) -> Path:
    """A log whose WAL was never checkpointed: twelve completed turns, then
    kill -9 (about 2.5 MB of WAL, all of one generation)."""
    tmp = tmp_path_factory.mktemp("crashed")
    db = tmp / "ev.db"
    chat = subprocess.Popen([sys.executable, "-m", "voice", "chat", "--db", str(db)], cwd=ROOT, env=env_for(tmp),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert chat.stdin is not None and chat.stdout is not None
    chat.stdin.write("what time is it\n" * 12)
    chat.stdin.flush()
    answered = 0
    while answered < 12:
        answered += chat.stdout.readline().startswith("assistant:")
    while True:  # the last turn's end is committed
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as peek:
            if peek.execute("SELECT COUNT(*) FROM events WHERE type = 'turn/end'").fetchone()[0] == 12:
                break
    chat.kill()
    chat.wait()
    assert Path(f"{db}-wal").stat().st_size > 100 * FRAME
    return db


def cut(by: int):
    def damage(wal: Path) -> None:
        os.truncate(wal, wal.stat().st_size - by)
    return damage


def cut_in_half(wal: Path) -> None:
    os.truncate(wal, wal.stat().st_size // 2)


def flip_a_byte(wal: Path) -> None:
    data = bytearray(wal.read_bytes())
    data[32 + 100 * FRAME + 24 + 500] ^= 0xFF
    wal.write_bytes(bytes(data))


def zero_the_header(wal: Path) -> None:
    data = bytearray(wal.read_bytes())
    data[:32] = bytes(32)
    wal.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [cut(100), cut_in_half, flip_a_byte, zero_the_header],
                         ids=["cut-by-100-bytes", "cut-in-half", "a-flipped-byte", "zeroed-header"])
def test_a_damaged_wal_is_said_and_kept_never_a_quiet_loss(tmp_path, crashed_log, damage):
    db = tmp_path / "ev.db"
    for suffix in ("", "-wal", "-shm"):
        shutil.copy(f"{crashed_log}{suffix}", f"{db}{suffix}")
    damage(Path(f"{db}-wal"))
    found = {suffix: Path(f"{db}{suffix}").read_bytes() for suffix in ("", "-wal", "-shm")}

    out = voice(tmp_path, "chat", "--db", str(db), stdin="what time is it\n")
    one_line_error(out, str(db), "damaged", "write-ahead log")
    (copy,) = re.findall(r"kept in (\S+?),", out.stderr)
    for suffix, data in found.items():  # the files as they were found, byte for byte
        assert (Path(copy) / f"ev.db{suffix}").read_bytes() == data
    assert "assistant:" not in out.stdout  # nothing ran on the damaged log

    again = voice(tmp_path, "chat", "--db", str(db), stdin="what time is it\n")  # from what was readable
    assert again.returncode == 0, again.stderr
    store = EventStore(db)
    try:
        notes = [e.payload for e in store.events(types={ev.RECOVERY}) if "log_damage" in e.payload]
        ends = [e for e in store.events(types={ev.TURN_END})]
    finally:
        store.close()
    if damage is not zero_the_header:  # the header names the log's only copy of every event but the schema
        assert notes and notes[0]["copy"] == copy and notes[0]["lost_commits"] >= 1
    assert ends[-1].payload["outcome"] == ev.COMPLETED


def test_an_intact_wal_after_a_kill_starts_without_a_word(tmp_path, crashed_log):
    db = tmp_path / "ev.db"
    for suffix in ("", "-wal", "-shm"):
        shutil.copy(f"{crashed_log}{suffix}", f"{db}{suffix}")
    out = voice(tmp_path, "chat", "--db", str(db), stdin="what time is it\n")
    assert out.returncode == 0 and "damaged" not in out.stderr, out.stderr
    store = EventStore(db)
    try:
        ends = store.events(types={ev.TURN_END})
    finally:
        store.close()
    assert [e.payload["outcome"] for e in ends] == [ev.COMPLETED] * 13  # not one re-closed as interrupted


# -- a damaged database file --------------------------------------------------------------------


def test_overwritten_pages_are_one_line_with_a_copy(tmp_path):
    db = tmp_path / "ev.db"
    out = voice(tmp_path, "chat", "--db", str(db), stdin="what time is it\n" * 20)
    assert out.returncode == 0, out.stderr
    assert not Path(f"{db}-wal").exists()  # checkpointed at a clean exit: the pages are in the file
    data = bytearray(db.read_bytes())
    assert len(data) >= 8 * 4096
    data[3 * 4096:6 * 4096] = bytes(range(256)) * 48  # pages 4-6: b-tree pages, overwritten
    db.write_bytes(bytes(data))
    for command in (["history"], ["effects"], ["chat"]):
        out = voice(tmp_path, *command, "--db", str(db), stdin="what time is it\n")
        one_line_error(out, str(db), "damaged", ".recover")
    (copy,) = tmp_path.glob("ev.db.damaged-*")
    assert (copy / "ev.db").read_bytes() == bytes(data)


# -- a --db that cannot be a log ----------------------------------------------------------------


@pytest.mark.parametrize("where", ["a-directory", "under-a-file", "deeper-under-a-file"])
def test_a_db_path_that_cannot_hold_a_log_is_one_line(tmp_path, where):
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "file").write_text("not a folder\n")
    db = {"a-directory": tmp_path / "a-directory", "under-a-file": tmp_path / "file" / "ev.db",
          "deeper-under-a-file": tmp_path / "file" / "x" / "ev.db"}[where]
    for command in (["chat"], ["history"], ["effects"]):
        out = voice(tmp_path, *command, "--db", str(db), stdin="hello\n")
        one_line_error(out, str(db))
    assert (tmp_path / "file").read_text() == "not a folder\n"
