"""Issue #11, finding 1: tool-call ids unique for the life of the log, and
logs the old code wedged start again (schema migration 3 + recovery).

Every test runs `voice` as a process on a real log, as a person would: one
`voice chat` per line of input, each a new process with fresh ids of its
provider ("skill_1", "call_1_0", "call_0" again and again)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from loopback_llm import LoopbackLLM
from voice.log import events as ev
from voice.log.schema import SCHEMA_VERSION
from voice.log.store import EventStore

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "tests" / "fixtures" / "logs"


def env_for(tmp: Path) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(tmp / "state"), "XDG_DATA_HOME": str(tmp / "data"),
            "XDG_CONFIG_HOME": str(tmp / "config"), "XDG_RUNTIME_DIR": str(tmp / "run"), "HF_HUB_OFFLINE": "1"}


def voice(tmp: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voice", *args], cwd=ROOT, env=env_for(tmp), input=stdin,
                          capture_output=True, text=True, timeout=60)


def read_log(db: Path) -> list[ev.Event]:
    store = EventStore(db)
    try:
        return store.events()
    finally:
        store.close()


def notes(tmp: Path) -> list[str]:
    path = tmp / "data" / "voice" / "notes.txt"
    return [line.partition("\t")[2] for line in path.read_text().splitlines()] if path.exists() else []


def assert_sound(events: list[ev.Event]) -> None:
    """Every turn ended exactly once; every call has its own id and one result."""
    starts = [(e.conversation, e.turn) for e in events if e.type == ev.TURN_START]
    ends = Counter((e.conversation, e.turn) for e in events if e.type == ev.TURN_END)
    assert all(ends[t] == 1 for t in starts) and len(ends) == len(starts), (starts, ends)
    calls = [e.payload["tool_call_id"] for e in events if e.type == ev.TOOL_CALL]
    assert len(calls) == len(set(calls)), f"tool-call ids repeat in the log: {calls}"
    results = Counter(e.payload["tool_call_id"] for e in events if e.type == ev.TOOL_RESULT)
    assert all(results[c] == 1 for c in calls), results


def test_the_issues_three_runs_never_wedge(tmp_path):
    db = str(tmp_path / "ev.db")
    for line in ("what time is it", "add a note buy milk", "what time is it"):
        out = voice(tmp_path, "chat", "--db", db, stdin=line + "\n")
        assert out.returncode == 0, out.stderr
        assert "Traceback" not in out.stderr and "recovered" not in out.stderr
    events = read_log(Path(db))
    assert_sound(events)
    assert [e.payload["outcome"] for e in events if e.type == ev.TURN_END] == [ev.COMPLETED] * 3
    # the provider's own ids are kept for the record; ours are what history uses
    calls = [e.payload for e in events if e.type == ev.TOOL_CALL]
    assert [c["provider_id"] for c in calls] == ["skill_1", "skill_1", "skill_1"]
    effects = json.loads(voice(tmp_path, "effects", "--json", "--db", db).stdout)
    assert [(e["tool"], e["state"]) for e in effects] == [("add_note", ev.CONFIRMED)]
    assert notes(tmp_path) == ["buy milk"]


def test_scripted_replies_in_two_processes_keep_their_own_receipts(tmp_path):
    script = tmp_path / "note.toml"
    script.write_text('[[reply]]\nchunk_delay_ms = 1\n[[reply.tool_calls]]\nname = "add_note"\n'
                      'arguments = { text = "water the plants" }\n[[reply]]\nchunk_delay_ms = 1\ntext = "Saved."\n')
    db = str(tmp_path / "ev.db")
    for _ in range(2):  # both processes name their call "call_1_0"
        out = voice(tmp_path, "chat", "--db", db, "--llm", f"scripted:{script}", stdin="note: water the plants\n")
        assert out.returncode == 0, out.stderr
    assert_sound(read_log(Path(db)))
    effects = json.loads(voice(tmp_path, "effects", "--json", "--db", db).stdout)
    assert [e["state"] for e in effects] == [ev.CONFIRMED, ev.CONFIRMED]
    # each write's receipt is its own: the second line of the file, not the first one's again
    line = len("2026-11-30 18:14:00\twater the plants\n".encode())
    assert [e["evidence"]["offset"] for e in effects] == [0, line]
    assert notes(tmp_path) == ["water the plants", "water the plants"]


@pytest.mark.parametrize("ids", ["omit", "repeat"])
def test_a_server_that_omits_or_repeats_ids(tmp_path, ids):
    """Ollama-style servers send no id, or the same one every time."""
    db = str(tmp_path / "ev.db")
    with LoopbackLLM(ids=ids) as llm:
        for line in ("note: buy milk", "what time is it", "note: buy eggs", "what time is it"):
            out = voice(tmp_path, "chat", "--db", db, "--llm", llm.base_url, stdin=line + "\n")
            assert out.returncode == 0, out.stderr
    events = read_log(Path(db))
    assert_sound(events)
    effects = json.loads(voice(tmp_path, "effects", "--json", "--db", db).stdout)
    assert [(e["arguments"]["text"], e["state"]) for e in effects] == [("buy milk", "confirmed"),
                                                                       ("buy eggs", "confirmed")]
    assert notes(tmp_path) == ["buy milk", "buy eggs"]
    # the history sent back to the server pairs each result with its own call
    sent = llm.requests[-1]["messages"]
    call_ids = [c["id"] for m in sent if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    result_ids = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
    assert call_ids == result_ids and len(set(call_ids)) == len(call_ids) == 4


# -- logs wedged by the code before this fix (tests/fixtures/logs/make_wedged.sh) --------------


def wedged(tmp_path: Path, name: str) -> Path:
    db = tmp_path / "ev.db"
    shutil.copy(LOGS / f"wedged_{name}.db", db)
    (tmp_path / "data" / "voice").mkdir(parents=True)
    shutil.copy(LOGS / f"wedged_{name}.notes.txt", tmp_path / "data" / "voice" / "notes.txt")
    return db


def test_the_wedged_skills_log_starts_and_its_open_turn_tells_the_truth(tmp_path):
    db = wedged(tmp_path, "skills")
    before = sqlite3.connect(db).execute("SELECT COUNT(*) FROM events").fetchone()[0]
    out = voice(tmp_path, "chat", "--db", str(db), stdin="what time is it\n")
    assert out.returncode == 0, out.stderr
    assert "recovered: closed 1 unfinished turn(s) as interrupted" in out.stderr
    assert "assistant: It is" in out.stdout
    events = read_log(db)
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert [e.seq for e in events[:before]] == list(range(1, before + 1))  # nothing lost or rewritten
    starts = [(e.conversation, e.turn) for e in events if e.type == ev.TURN_START]
    assert Counter((e.conversation, e.turn) for e in events if e.type == ev.TURN_END) == Counter(starts)
    # turn 2 saved the note and its receipt confirmed it: the model is told so, not "cancelled"
    (result,) = [e.payload for e in events if e.turn == 2 and e.type == ev.TOOL_RESULT]
    assert result["receipt"] == ev.CONFIRMED and result["status"] == "ok"
    history = json.loads(voice(tmp_path, "history", "--json", "--db", str(db)).stdout)
    tool_messages = [m["content"] for m in history if m["role"] == "tool"]
    assert tool_messages[1].startswith("confirmed:") and "cancelled" not in tool_messages[1]
    effects = json.loads(voice(tmp_path, "effects", "--json", "--db", str(db)).stdout)
    assert [(e["turn"], e["state"]) for e in effects] == [(2, ev.CONFIRMED)]
    again = voice(tmp_path, "chat", "--db", str(db), stdin="what time is it\n")  # and every later start
    assert again.returncode == 0 and "recovered" not in again.stderr, again.stderr
    assert notes(tmp_path) == ["buy milk"]


def test_the_wedged_scripted_log_no_longer_borrows_a_receipt(tmp_path):
    """The old `voice effects` showed turn 2 confirmed with turn 1's receipt.
    Turn 2 has none of its own: recovery marks it unknown and reconciles it
    against the notes file, finding the line written after its dispatch."""
    db = wedged(tmp_path, "scripted")
    out = voice(tmp_path, "effects", "--json", "--db", str(db))
    assert out.returncode == 0, out.stderr
    before = json.loads(out.stdout)
    assert [(e["turn"], e["state"]) for e in before] == [(1, ev.CONFIRMED), (2, ev.UNKNOWN)]  # no borrowing
    out = voice(tmp_path, "chat", "--db", str(db), stdin="what time is it\n")
    assert out.returncode == 0, out.stderr
    assert "1 write(s) of unknown outcome, 1 reconciled" in out.stderr
    effects = json.loads(voice(tmp_path, "effects", "--json", "--db", str(db)).stdout)
    first_line = len((LOGS / "wedged_scripted.notes.txt").read_bytes().splitlines(keepends=True)[0])
    assert [(e["turn"], e["state"], e["outcome"], e["evidence"]["offset"]) for e in effects] == [
        (1, ev.CONFIRMED, ev.CONFIRMED, 0), (2, "reconciled", ev.CONFIRMED, first_line)]
    assert notes(tmp_path) == ["water the plants", "water the plants"]  # nothing ran again
    events = read_log(db)
    starts = [(e.conversation, e.turn) for e in events if e.type == ev.TURN_START]
    assert Counter((e.conversation, e.turn) for e in events if e.type == ev.TURN_END) == Counter(starts)
