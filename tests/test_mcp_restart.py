"""MCP writes and approvals across kill -9: real `voice chat` processes that
SIGKILL themselves at an exact commit point (tests/killpoint.py), with the
chaos MCP server (tests/mcp_servers/chaos_server.py) as a real child
process, restarted on the same log each time.

What users rely on: no write is run twice (each door is unlocked at most
once, and exactly when its receipt is confirmed), every call has one
result, no start fails, no server outlives the voice process that started
it, and a question the person never answered is asked again after the
restart and dispatches only on a new yes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from killpoint import killpoints_fixture
from mcp_fixtures import chaos_server_command, events, process_is_running
from voice.log import events as ev
from voice.log.store import EventStore

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


killpoints = killpoints_fixture()


def setup(tmp: Path, approve: str) -> tuple[dict[str, str], Path, Path]:
    journal = tmp / "chaos.journal"
    argv = chaos_server_command(journal)
    config = tmp / "voice.toml"
    config.write_text(f"[mcp.servers.chaos]\ncommand = {json.dumps(argv[0])}\nargs = {json.dumps(argv[1:])}\n"
                      f'approve = "{approve}"\n')
    env = {**os.environ, "XDG_STATE_HOME": str(tmp / "state"), "XDG_DATA_HOME": str(tmp / "data"),
           "XDG_CONFIG_HOME": str(tmp / "config"), "HF_HUB_OFFLINE": "1"}
    return env, config, journal


def chat(tmp: Path, config: Path, k: int, door: str | None) -> list[str]:
    """`voice chat` whose model unlocks `door` and then says so (door None: it only says so)."""
    script = tmp / f"unlock{k}.toml"
    call = ('[[reply]]\nchunk_delay_ms = 0\n[[reply.tool_calls]]\nname = "chaos__unlock_door"\n'
            f'arguments = {{ door = "{door}" }}\n') if door else ""
    script.write_text(call + '[[reply]]\nchunk_delay_ms = 0\ntext = "Unlocked."\n')
    return ["chat", "--config", str(config), "--db", str(tmp / "ev.db"), "--llm", f"scripted:{script}"]


def all_events(tmp: Path) -> list[ev.Event]:
    store = EventStore(tmp / "ev.db")
    try:
        return store.events()
    finally:
        store.close()


def servers_left(journal: Path) -> list[int]:
    """Pids of chaos servers still alive (a few ms after their parent died)."""
    deadline = time.monotonic() + 2.0
    while True:
        alive = [e["pid"] for e in events(journal, "pid") if process_is_running(e["pid"])]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


def test_kill_at_every_commit_point_of_an_mcp_write(tmp_path, killpoints):
    env, config, journal = setup(tmp_path, approve="never")
    clean = killpoints.run(chat(tmp_path, config, 0, "d0"), env=env, out=tmp_path / "run0", stdin="unlock d0\n")
    assert clean["rc"] == 0, clean["stderr"]
    points = clean["commits"]
    assert points >= 10, clean
    for k in range(1, points + 1):
        run = killpoints.run(chat(tmp_path, config, k, f"d{k}"), env=env, out=tmp_path / f"run{k}",
                             stdin=f"unlock d{k}\n", kill_after=k)
        assert run["signal"] == 9 and run["commits"] == k, (k, run)
        assert servers_left(journal) == [], f"a server outlived the voice process killed at commit {k}"
    final = killpoints.run(chat(tmp_path, config, points + 1, "last"), env=env, out=tmp_path / "last",
                           stdin="unlock last\n")
    assert final["rc"] == 0 and "Traceback" not in final["stderr"], final["stderr"]

    log = all_events(tmp_path)
    starts = [(e.conversation, e.turn) for e in log if e.type == ev.TURN_START]
    assert Counter(starts) == Counter((e.conversation, e.turn) for e in log if e.type == ev.TURN_END)
    calls = [e.payload["tool_call_id"] for e in log if e.type == ev.TOOL_CALL]
    results = Counter(e.payload["tool_call_id"] for e in log if e.type == ev.TOOL_RESULT)
    assert len(calls) == len(set(calls)) and set(results) == set(calls) and set(results.values()) == {1}
    unlocked = Counter(e["label"] for e in events(journal, "done"))
    assert max(unlocked.values()) == 1, f"a write ran twice: {unlocked}"
    effects = json.loads(subprocess.run([sys.executable, "-m", "voice", "effects", "--json", "--db",
                                         str(tmp_path / "ev.db")], cwd=ROOT, env=env, capture_output=True,
                                        text=True, timeout=60).stdout)
    for effect in effects:  # confirmed exactly when the server finished it; unknown never turned into a guess
        door = effect["arguments"]["door"]
        if effect["outcome"] == ev.CONFIRMED:
            assert unlocked[door] == 1, effect
        else:
            assert effect["outcome"] == ev.UNKNOWN, effect
    assert {e["arguments"]["door"] for e in effects if e["outcome"] == ev.UNKNOWN}, "no kill fell mid-call"


def test_a_question_left_unanswered_by_a_crash_is_asked_again_and_needs_a_new_yes(tmp_path, killpoints):
    env, config, journal = setup(tmp_path, approve="destructive")
    killed = killpoints.run(chat(tmp_path, config, 1, "front"), env=env, out=tmp_path / "run1",
                            stdin="unlock the front door\n", kill_after=ev.APPROVAL_REQUESTED)
    assert killed["signal"] == 9
    # The next start asks again before anything else; "no" declines it: never dispatched.
    declined = killpoints.run(chat(tmp_path, config, 2, None), env=env, out=tmp_path / "run2", stdin="no\n")
    assert declined["rc"] == 0, declined["stderr"]
    assert re.search(r"Before I stopped, \d+ seconds ago, I was asking you this\. Should I use unlock_door on chaos, "
                     r"with door front\?", declined["stdout"]), declined["stdout"]
    assert not events(journal, "start")
    # Asked once, answered once: a third start asks nothing.
    quiet = killpoints.run(chat(tmp_path, config, 3, "back"), env=env, out=tmp_path / "run3",
                           stdin="unlock the back door\nyes\n")
    assert quiet["rc"] == 0, quiet["stderr"]
    assert quiet["stdout"].count("Should I") == 1 and "door back" in quiet["stdout"]
    assert [e["label"] for e in events(journal, "done")] == ["back"]

    log = all_events(tmp_path)
    answers = [(e.payload["approval_id"], e.payload["decision"], e.payload["how"]) for e in log
               if e.type == ev.APPROVAL_ANSWERED]
    asked = [(e.payload["approval_id"], e.payload.get("asked_again")) for e in log if e.type == ev.APPROVAL_REQUESTED]
    first, again, back = asked
    assert again[1] == first[0] and back[1] is None
    assert answers == [(first[0], "withdrawn", "restart"), (again[0], "denied", "text"), (back[0], "granted", "text")]
    # Every dispatch of a call that asks first comes after its grant in the log.
    granted = {e.payload["approval_id"]: e.seq for e in log
               if e.type == ev.APPROVAL_ANSWERED and e.payload["decision"] == "granted"}
    for e in log:
        if e.type == ev.TOOL_DISPATCH:
            assert granted[e.payload["tool_call_id"]] < e.seq


def test_a_question_asked_again_dispatches_on_yes(tmp_path, killpoints):
    env, config, journal = setup(tmp_path, approve="destructive")
    killpoints.run(chat(tmp_path, config, 1, "front"), env=env, out=tmp_path / "run1",
                   stdin="unlock the front door\n", kill_after=ev.APPROVAL_REQUESTED)
    again = killpoints.run(chat(tmp_path, config, 2, None), env=env, out=tmp_path / "run2", stdin="yes\n")
    assert again["rc"] == 0, again["stderr"]
    assert [e["label"] for e in events(journal, "done")] == ["front"]
    assert "assistant: Unlocked." in again["stdout"]
