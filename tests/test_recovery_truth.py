"""Issue #11, finding 2: recovery states what the receipts prove. A real
`voice chat` process is killed right after a chosen event is committed
(tests/killpoint.py), then a new one starts on the same log."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from killpoint import KillPoints
from voice.log import events as ev

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def killpoints() -> Iterator[KillPoints]:
    k = KillPoints()
    yield k
    k.close()


def env_for(tmp: Path) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(tmp / "state"), "XDG_DATA_HOME": str(tmp / "data"),
            "XDG_CONFIG_HOME": str(tmp / "config"), "HF_HUB_OFFLINE": "1"}


def voice(tmp: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voice", *args, "--db", str(tmp / "ev.db")], cwd=ROOT,
                          env=env_for(tmp), input=stdin, capture_output=True, text=True, timeout=60)


def notes_file(tmp: Path) -> Path:
    return tmp / "data" / "voice" / "notes.txt"


def test_a_confirmed_write_cut_off_before_its_result_is_reported_done_and_not_repeated(tmp_path, killpoints):
    run = killpoints.run(["chat", "--db", str(tmp_path / "ev.db")], env=env_for(tmp_path), out=tmp_path / "k",
                         stdin="add a note buy milk\n", kill_after=ev.EFFECT_RECEIPT)
    assert run["signal"] == 9, run["stderr"]
    assert notes_file(tmp_path).read_text().endswith("\tbuy milk\n")  # the note was written and confirmed

    restart = voice(tmp_path, "chat")
    assert restart.returncode == 0, restart.stderr
    assert "recovered: closed 1 unfinished turn(s) as interrupted; 0 write(s) of unknown outcome" in restart.stderr
    history = json.loads(voice(tmp_path, "history", "--json").stdout)
    (result,) = [m["content"] for m in history if m["role"] == "tool"]
    assert result.startswith("confirmed:") and "cancelled" not in result  # never "cancelled" to the model
    (effect,) = json.loads(voice(tmp_path, "effects", "--json").stdout)
    assert effect["state"] == ev.CONFIRMED

    again = voice(tmp_path, "chat", stdin="add a note buy milk\n")  # the person, not having heard, asks again
    assert again.returncode == 0, again.stderr
    history = json.loads(voice(tmp_path, "history", "--json").stdout)
    blocked = [m["content"] for m in history if m["role"] == "tool"][1]
    assert blocked.startswith("blocked:") and "did happen" in blocked
    assert "it was already done" in again.stdout
    assert notes_file(tmp_path).read_text().count("buy milk") == 1  # the write that happened did not run again

    third = voice(tmp_path, "chat", stdin="add a note buy milk\n")  # told once; asked again, it is a new request
    assert third.returncode == 0 and "Done, I saved the note." in third.stdout, third.stderr
    assert notes_file(tmp_path).read_text().count("buy milk") == 2


def test_an_older_note_with_the_same_text_does_not_confirm_an_unknown_write(tmp_path, killpoints):
    run = killpoints.run(["chat", "--db", str(tmp_path / "ev.db")], env=env_for(tmp_path), out=tmp_path / "k",
                         stdin="add a note buy milk\n", kill_after=ev.TOOL_DISPATCH)
    assert run["signal"] == 9, run["stderr"]
    # Killed after the dispatch, before the note was written. The file holds an
    # older note with the same text, from two minutes before.
    earlier = datetime.datetime.now() - datetime.timedelta(minutes=2)
    notes_file(tmp_path).parent.mkdir(parents=True, exist_ok=True)
    notes_file(tmp_path).write_text(f"{earlier:%Y-%m-%d %H:%M:%S}\tbuy milk\n")

    again = voice(tmp_path, "chat")
    assert again.returncode == 0, again.stderr
    assert "1 write(s) of unknown outcome, 1 reconciled" in again.stderr
    (effect,) = json.loads(voice(tmp_path, "effects", "--json").stdout)
    assert (effect["state"], effect["outcome"]) == ("reconciled", ev.FAILED), effect
    assert notes_file(tmp_path).read_text().count("buy milk") == 1


def test_a_note_written_after_the_dispatch_confirms_it(tmp_path, killpoints):
    """The other side of the stamp rule (minute-precision lines of older
    versions included): a line from the dispatch's own minute counts."""
    run = killpoints.run(["chat", "--db", str(tmp_path / "ev.db")], env=env_for(tmp_path), out=tmp_path / "k",
                         stdin="add a note buy milk\n", kill_after=ev.TOOL_DISPATCH)
    assert run["signal"] == 9, run["stderr"]
    notes_file(tmp_path).parent.mkdir(parents=True, exist_ok=True)
    notes_file(tmp_path).write_text(f"{datetime.datetime.now():%Y-%m-%d %H:%M}\tbuy milk\n")
    assert voice(tmp_path, "chat").returncode == 0
    (effect,) = json.loads(voice(tmp_path, "effects", "--json").stdout)
    assert (effect["state"], effect["outcome"]) == ("reconciled", ev.CONFIRMED), effect
