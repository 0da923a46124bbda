"""Asking before a destructive call, by voice, end to end on replayed audio
(real Silero, Whisper, Piper and the pipecat pipeline; `voice replay`'s
entry point, in the test process: tests/voice_in_process.py): the question is said aloud, the person's next words
answer it (not a barge-in, not a new request, no wake word needed in the
conversation window), and "Stop." over the question withdraws it. The call
is dispatched only after a grant on the log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from voice_in_process import voice_replay
from voice.log import events as ev
from voice.log.store import EventStore

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "tests" / "fixtures" / "scenarios"

pytestmark = pytest.mark.slow


def replay(tmp_path: Path, name: str) -> tuple[list[ev.Event], str]:
    out = tmp_path / name
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp_path / "config")}
    proc = voice_replay([str(SCENARIOS / f"{name}.toml"), "--out", str(out), "-v"], env)  # in this process
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = EventStore(out / "events.db", read_only=True)
    try:
        return store.events(), proc.stdout
    finally:
        store.close()


def of(log: list[ev.Event], type_: str) -> list:
    return [e for e in log if e.type == type_]


QUESTION = "Should I use home__unlock_door, with door front? Say yes or no."


@pytest.mark.parametrize("name", ["approval_yes", "approval_wake"])
def test_yes_said_after_the_question_dispatches_the_call(tmp_path, name):
    log, stdout = replay(tmp_path, name)
    assert f"notice: {QUESTION}" in stdout
    answered = [e.body for e in of(log, ev.APPROVAL_ANSWERED)]
    assert [(a.decision, a.how) for a in answered] == [("granted", "voice")]
    assert "yes" in answered[0].words.lower()
    granted_at = of(log, ev.APPROVAL_ANSWERED)[0].seq
    assert [e.seq > granted_at for e in of(log, ev.TOOL_DISPATCH)] == [True]
    # One turn: the answer was not a request of its own.
    assert len(of(log, ev.TURN_START)) == 1 and len(of(log, ev.USER_MESSAGE)) == 1
    assert "assistant: The front door is unlocked." in stdout


def test_no_said_after_the_question_declines_and_the_model_is_told(tmp_path):
    log, stdout = replay(tmp_path, "approval_no")
    answered = [e.body for e in of(log, ev.APPROVAL_ANSWERED)]
    assert [(a.decision, a.how) for a in answered] == [("denied", "voice")]
    assert not of(log, ev.TOOL_DISPATCH)
    result = of(log, ev.TOOL_RESULT)[0].body
    assert result.status == ev.DECLINED and "the person declined" in result.error and "leave it" in result.error
    assert "assistant: Okay, I left it locked." in stdout
    assert len(of(log, ev.TURN_START)) == 1


def test_stop_over_the_question_withdraws_it_and_nothing_is_dispatched(tmp_path):
    log, stdout = replay(tmp_path, "approval_stop")
    answered = [e.body for e in of(log, ev.APPROVAL_ANSWERED)]
    assert [(a.decision, a.how) for a in answered] == [("withdrawn", "stopped")]
    assert not of(log, ev.TOOL_DISPATCH)
    assert [e.body.outcome for e in of(log, ev.TURN_END)] == [ev.ABORTED]
    assert "This is never said" not in stdout


def test_a_replay_starts_no_mcp_server_and_asks_as_the_scenario_says(tmp_path):
    """The replay never acts on the world: the config's MCP servers are not
    started (the scenario's stand-in answers), and the question is asked as
    it was."""
    journal = tmp_path / "chaos.journal"
    argv = [sys.executable, str(ROOT / "tests" / "mcp_servers" / "chaos_server.py"), "--journal", str(journal)]
    config = tmp_path / "voice.toml"
    config.write_text(f"[mcp.servers.home]\ncommand = {json.dumps(argv[0])}\nargs = {json.dumps(argv[1:])}\n")
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp_path / "config")}
    proc = subprocess.run([sys.executable, "-m", "voice", "replay", str(SCENARIOS / "approval_yes.toml"), "--config",
                           str(config), "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not journal.exists(), "the replay started the config's MCP server"
    assert f"notice: {QUESTION}" in proc.stdout
