"""I10 with a real process: kill -9 `voice chat` at different points, start
it again, and check the log: nothing lost, the turn closed `interrupted`,
the write `unknown` (or reconciled) and never executed twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from voice.log import events as ev
from voice.log.store import EventStore

ROOT = Path(__file__).resolve().parents[1]


def start_chat(tmp_path: Path, script: Path, config: Path) -> subprocess.Popen:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_DATA_HOME": str(tmp_path / "data"),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "voice", "chat", "--db", str(tmp_path / "events.db"),
                             "--config", str(config), "--llm", f"scripted:{script}"],
                            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def voice(tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_DATA_HOME": str(tmp_path / "data"),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "voice", *args, "--db", str(tmp_path / "events.db")],
                          cwd=ROOT, env=env, input=stdin, capture_output=True, text=True, timeout=60)


def wait_for(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def running_with(text: str) -> list[int]:
    """Live processes whose command line mentions `text` (a zombie has ended)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            running = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZXx"
            if running and text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def read_log(tmp_path: Path):
    store = EventStore(tmp_path / "events.db")
    try:
        return store.events()
    finally:
        store.close()


@pytest.fixture
def setup(tmp_path):
    mark = tmp_path / "ran.txt"
    config = tmp_path / "voice.toml"
    config.write_text(f'[tools.commands]\nslowjob = ["sh", "-c", "echo ran >> {mark}; sleep 3"]\n')
    script = tmp_path / "replies.toml"
    script.write_text(
        '[[reply]]\nchunk_delay_ms = 5\ntext = "Starting the job."\n'
        '[[reply.tool_calls]]\nname = "run_command"\narguments = { name = "slowjob" }\n'
        '[[reply]]\nchunk_delay_ms = 5\ntext = "It finished."\n'
    )
    return mark, config, script


def test_kill_during_a_write_leaves_it_unknown_and_never_runs_it_twice(tmp_path, setup):
    mark, config, script = setup
    chat = start_chat(tmp_path, script, config)
    chat.stdin.write("run the slow job\nyes\n")  # (a configured command asks first)
    chat.stdin.flush()
    wait_for(mark.exists)  # the command has started: between dispatch and receipt
    chat.send_signal(signal.SIGKILL)
    chat.wait(10)
    events = read_log(tmp_path)
    assert [e.type for e in events if e.type in (ev.TOOL_DISPATCH, ev.EFFECT_RECEIPT, ev.TURN_END)] == [ev.TOOL_DISPATCH]

    effects = json.loads(voice(tmp_path, "effects", "--json").stdout)
    assert effects == [{"tool": "run_command", "arguments": {"name": "slowjob"}, "state": "unknown", "turn": 1,
                        "outcome": "unknown", "conversation": events[0].conversation,
                        "tool_call_id": effects[0]["tool_call_id"], "evidence": {"reason": "no receipt was recorded"}}]

    again = voice(tmp_path, "chat", "--config", str(config), "--llm", f"scripted:{script}")  # restart, no input
    assert again.returncode == 0, again.stderr
    assert "recovered: closed 1 unfinished turn(s) as interrupted; 1 write(s) of unknown outcome" in again.stderr
    after = read_log(tmp_path)
    assert [e.seq for e in after[: len(events)]] == [e.seq for e in events]  # nothing lost
    ends = [e for e in after if e.type == ev.TURN_END]
    assert [(e.turn, e.payload["outcome"]) for e in ends] == [(1, ev.INTERRUPTED)]
    receipts = [e.payload for e in after if e.type == ev.EFFECT_RECEIPT]
    assert [(r["state"], r["phase"]) for r in receipts] == [("unknown", "dispatch")]
    wait_for(lambda: not running_with(str(mark)))  # the orphaned job has finished (was 3.5 s of sleeping)
    # nothing ran it again:
    assert mark.read_text() == "ran\n"
    assert json.loads(voice(tmp_path, "effects", "--json").stdout)[0]["state"] == "unknown"


def test_kill_before_dispatch_leaves_no_effect(tmp_path, setup):
    mark, config, script = setup
    script.write_text('[[reply]]\nfirst_delay_ms = 5000\ntext = "Never sent."\n')
    chat = start_chat(tmp_path, script, config)
    chat.stdin.write("hello\n")
    chat.stdin.flush()
    wait_for(lambda: any(e.type == ev.ASSISTANT_STREAM for e in read_log(tmp_path)))
    chat.send_signal(signal.SIGKILL)
    chat.wait(10)
    again = voice(tmp_path, "chat", "--config", str(config), "--llm", f"scripted:{script}")
    assert again.returncode == 0, again.stderr
    after = read_log(tmp_path)
    types = [e.type for e in after if e.turn == 1]
    assert types[-4:] == [ev.ASSISTANT_ATTEMPT, ev.ASSISTANT_STREAM, ev.STEP_END, ev.TURN_END]
    assert after[-1].type == ev.RECOVERY or types[-1] == ev.TURN_END
    assert json.loads(voice(tmp_path, "effects", "--json").stdout) == []
    assert not mark.exists()
    history = json.loads(voice(tmp_path, "history", "--json").stdout)
    assert history == [{"role": "user", "content": "hello"}]


def test_a_completed_write_survives_a_kill_afterwards(tmp_path, setup):
    mark, config, script = setup
    config.write_text(f'[tools.commands]\nslowjob = ["sh", "-c", "echo ran >> {mark}"]\n')
    chat = start_chat(tmp_path, script, config)
    chat.stdin.write("run the job\nyes\n")  # (a configured command asks first)
    chat.stdin.flush()
    wait_for(lambda: any(e.type == ev.TURN_END for e in read_log(tmp_path)))
    chat.send_signal(signal.SIGKILL)
    chat.wait(10)
    voice(tmp_path, "chat", "--config", str(config), "--llm", f"scripted:{script}")
    (effect,) = json.loads(voice(tmp_path, "effects", "--json").stdout)
    assert effect["state"] == "confirmed" and effect["evidence"]["exit_status"] == 0
    assert mark.read_text() == "ran\n"
