"""MCP servers under the daemon (`voice run --replay`, the service's own
code path on a replay device): a question before a destructive call is
answered from a terminal with `voice ctl approve` / `voice ctl deny`, and
every server the daemon started is gone when it stops, within its bound."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcp_fixtures import chaos_server_command, events, process_is_running
from test_service import ROOT, SCENARIOS, Daemon, env_for, voice
from voice.log import events as ev

pytestmark = pytest.mark.slow


def unlock(door: str) -> str:
    return (f'[[reply]]\nchunk_delay_ms = 10\n[[reply.tool_calls]]\nname = "chaos__unlock_door"\n'
            f'arguments = {{ door = "{door}" }}\n')


def say(text: str) -> str:
    return f'[[reply]]\nchunk_delay_ms = 10\ntext = "{text}"\n'


def chaos_config(tmp_path: Path) -> tuple[Path, Path]:
    """(the chaos server's journal, a config in open mode that starts it)."""
    journal = tmp_path / "chaos.journal"
    argv = chaos_server_command(journal)
    config = tmp_path / "voice.toml"
    config.write_text(f'[listen]\nmode = "open"\n[mcp.servers.chaos]\ncommand = {json.dumps(argv[0])}\n'
                      f"args = {json.dumps(argv[1:])}\n")
    return journal, config


def said_at(path: Path, at_s: float) -> Path:
    """A replay device's scenario: "Unlock the front door." at `at_s`."""
    path.write_text(f'[[user]]\naudio = "{SCENARIOS.parent / "audio" / "unlock_door.wav"}"\nat = {at_s}\n')
    return path


def test_ctl_approve_and_deny_answer_the_question_and_the_server_goes_with_the_daemon(tmp_path):
    journal, config = chaos_config(tmp_path)
    script = tmp_path / "replies.toml"
    script.write_text(unlock("front") + say("The front door is unlocked.") + unlock("back") + say("I left it."))
    scenario = said_at(tmp_path / "unlock.toml", 0.3)
    d = Daemon(tmp_path, scenario, extra_args=("--config", str(config), "--llm", f"scripted:{script}"))
    try:
        d.pump(lambda: any(e.type == ev.APPROVAL_REQUESTED for e in d.events()), timeout=90)
        approved = voice(tmp_path, "ctl", "approve")
        assert approved.returncode == 0, approved.stderr
        assert approved.stdout == "granted: Should I use unlock_door on chaos, with door front? Say yes or no.\n"
        d.pump(lambda: any(e.type == ev.TURN_END for e in d.events()))
        assert [e["label"] for e in events(journal, "done")] == ["front"]
        # A typed turn asks about the back door: denied from the terminal while `ctl say` waits.
        typed = subprocess.Popen([sys.executable, "-m", "voice", "ctl", "say", "unlock the back door"], cwd=ROOT,
                                 env=env_for(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        d.pump(lambda: sum(e.type == ev.APPROVAL_REQUESTED for e in d.events()) == 2)
        denied = voice(tmp_path, "ctl", "deny")
        assert denied.returncode == 0 and denied.stdout.startswith("denied: "), denied.stderr
        out, _ = typed.communicate(timeout=60)
        assert "I left it." in out
        assert [e["label"] for e in events(journal, "done")] == ["front"]
        nothing = voice(tmp_path, "ctl", "deny")
        assert nothing.returncode == 1 and "no question is waiting for an answer" in nothing.stderr
        pid = events(journal, "pid")[0]["pid"]
        took = d.stop()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    answered = [(e.body.decision, e.body.how) for e in d.events() if e.type == ev.APPROVAL_ANSWERED]
    assert answered == [("granted", "ctl"), ("denied", "ctl")]
    assert not process_is_running(pid)
    # Was also `took < 5.0` (service.shutdown_s): a speed claim a loaded machine breaks; the daemon
    # bounds its own shutdown by it, stop() waits at most 20 s (the hang deadline), and what is relied
    # on is checked above: the MCP server is gone with the daemon.
    assert d.proc.returncode == 0, f"shutdown took {took:.1f} s"


def test_a_question_a_killed_daemon_left_is_asked_again_and_answered_from_the_terminal(tmp_path):
    journal, config = chaos_config(tmp_path)
    first = tmp_path / "first.toml"
    first.write_text(unlock("front"))
    scenario = said_at(tmp_path / "unlock.toml", 0.3)
    d = Daemon(tmp_path, scenario, extra_args=("--config", str(config), "--llm", f"scripted:{first}"))
    try:
        d.pump(lambda: any(e.type == ev.APPROVAL_REQUESTED for e in d.events()), timeout=90)
        server = events(journal, "pid")[0]["pid"]
    finally:
        d.proc.kill()  # kill -9 while the question waits
        d.proc.wait(10)
        d.notify.close()
        Path(d.notify_path).unlink()
    deadline = time.monotonic() + 5
    while process_is_running(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_is_running(server), "the MCP server outlived the daemon killed with -9"

    after = tmp_path / "after.toml"
    after.write_text(say("The front door is unlocked."))
    quiet = said_at(tmp_path / "quiet.toml", 600)  # nobody speaks in the next 10 minutes
    d = Daemon(tmp_path, quiet, extra_args=("--config", str(config), "--llm", f"scripted:{after}"))
    try:
        d.pump(lambda: sum(e.type == ev.APPROVAL_REQUESTED for e in d.events()) == 2, timeout=90)
        assert not events(journal, "start"), "dispatched without a new yes"
        approved = voice(tmp_path, "ctl", "approve")
        assert approved.returncode == 0, approved.stderr
        assert re.search(r"Before I stopped, \d+ seconds ago, I was asking you this\.", approved.stdout), approved.stdout
        d.pump(lambda: sum(e.type == ev.TURN_END for e in d.events()) == 2)
        d.stop()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    assert [e["label"] for e in events(journal, "done")] == ["front"]
    log = d.events()
    answered = [(e.body.decision, e.body.how) for e in log if e.type == ev.APPROVAL_ANSWERED]
    assert answered == [("withdrawn", "restart"), ("granted", "ctl")]
    assert [e.body.outcome for e in log if e.type == ev.TURN_END] == [ev.INTERRUPTED, ev.COMPLETED]


def test_a_write_on_an_mcp_server_runs_to_its_receipt_when_the_sound_card_goes(tmp_path):
    """#36: the sound card goes (the scenario's `[[audio_lost]]`, told as the live
    device tells it) while the chaos server's slow write runs. The person did not
    ask to stop: the call is not cancelled (the server finishes it), its receipt
    is confirmed, and the phrase announcing it is said once the card is back."""
    journal = tmp_path / "chaos.journal"
    argv = chaos_server_command(journal)
    config = tmp_path / "voice.toml"
    config.write_text(f'[listen]\nmode = "open"\n[mcp.servers.chaos]\ncommand = {json.dumps(argv[0])}\n'
                      f'args = {json.dumps(argv[1:])}\napprove = "never"\n')
    script = tmp_path / "replies.toml"
    script.write_text('[[reply]]\nchunk_delay_ms = 10\ntext = "Writing it down, this takes a while."\n'
                      'text_after_tools = "Done, it is written."\n'
                      'tool_calls = [{ name = "chaos__slow_write", arguments = { seconds = 10, label = "front" } }]\n')
    scenario = said_at(tmp_path / "unlock.toml", 0.3)
    # Lost 1.5 s into the reply (the write, 10 s long, is dispatched as its text ends), back 5 s later: a fixed
    # second would fall before the reply on a slow enough machine
    scenario.write_text(scenario.read_text() + "[[audio_lost]]\ninto_reply = 1.5\nback_after = 5.0\n")
    d = Daemon(tmp_path, scenario, extra_args=("--config", str(config), "--llm", f"scripted:{script}"))
    try:
        d.pump(lambda: "notice: Done, it is written." in d.out, timeout=120)
        d.stop()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    assert [e["label"] for e in events(journal, "done")] == ["front"] and not events(journal, "cancelled")
    log = d.events()
    (lost,) = [e for e in log if e.type == ev.AUDIO_LOST]
    (receipt,) = [e for e in log if e.type == ev.EFFECT_RECEIPT]
    (result,) = [e for e in log if e.type == ev.TOOL_RESULT]
    assert receipt.seq > lost.seq and receipt.body.state == ev.CONFIRMED and result.body.status == "ok", receipt
    (end,) = [e for e in log if e.type == ev.TURN_END]
    assert end.body.outcome == ev.INTERRUPTED and end.body.reason == ev.AUDIO_LOST_REASON, end
    back = next(i for i, line in enumerate(d.out) if line.startswith("notice: audio is back"))
    assert d.out.index("notice: Done, it is written.") > back, d.out
