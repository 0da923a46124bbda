"""Issue #11, finding 6 (what is not configuration): a directory named like
a WAV, an empty WAV, and bytes that are not UTF-8 on `voice chat`'s stdin.
One line and exit 2 for bad files; for a bad stream, no lost line, no open
turn, no hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from voice.log import events as ev
from voice.log.store import EventStore

ROOT = Path(__file__).resolve().parents[1]


def env_for(tmp: Path) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(tmp / "state"), "XDG_DATA_HOME": str(tmp / "data"),
            "XDG_CONFIG_HOME": str(tmp / "config"), "HF_HUB_OFFLINE": "1"}


def voice(tmp: Path, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voice", *args], cwd=ROOT, env=env_for(tmp), input=stdin,
                          capture_output=True, timeout=60)


@pytest.mark.parametrize("make,named", [
    (lambda p: p.mkdir(), "is a directory, not a WAV file"),
    (lambda p: p.write_bytes(b""), "it is empty (0 bytes)"),
    (lambda p: p.write_bytes(b"RIFF"), "before its WAV header does"),
], ids=["a-directory", "zero-bytes", "cut-header"])
def test_a_bad_wav_in_a_scenario_says_why(tmp_path, make, named):
    make(tmp_path / "a.wav")
    scenario = tmp_path / "s.toml"
    scenario.write_text('[[user]]\naudio = "a.wav"\nat = 0.3\n')
    out = voice(tmp_path, "replay", str(scenario), "--out", str(tmp_path / "out"))
    err = out.stderr.decode()
    assert out.returncode == 2 and err.count("\n") == 1 and named in err and "a.wav" in err, err


def test_a_directory_given_as_the_scenario(tmp_path):
    (tmp_path / "a.wav").mkdir()
    out = voice(tmp_path, "replay", str(tmp_path / "a.wav"), "--out", str(tmp_path / "out"))
    err = out.stderr.decode()
    assert out.returncode == 2 and err.count("\n") == 1 and "is a directory" in err, err


def test_bytes_that_are_not_utf8_on_chat_stdin_lose_no_line(tmp_path):
    db = tmp_path / "ev.db"
    lines = b"what time is it\n\xff\xfe add a note caf\xe9 au lait\nwhat time is it\n"
    out = voice(tmp_path, "chat", "--db", str(db), stdin=lines)  # ends: no hang after EOF
    assert out.returncode == 0, out.stderr.decode()
    store = EventStore(db)
    try:
        said = [e.payload["content"] for e in store.events(types={ev.USER_MESSAGE})]
        ends = [e.payload["outcome"] for e in store.events(types={ev.TURN_END})]
        open_turns = store.open_turns()
    finally:
        store.close()
    assert said == ["what time is it", "\ufffd\ufffd add a note caf\ufffd au lait", "what time is it"]
    assert ends == [ev.COMPLETED] * 3 and open_turns == []
    assert (tmp_path / "data" / "voice" / "notes.txt").read_text().endswith("\tcaf\ufffd au lait\n")
