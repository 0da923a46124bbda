"""A configured command ([tools.commands]) asks the person before it runs,
from the outside: `voice chat` as a person types, `voice acp` driven by the
official ACP TypeScript SDK (tests/acp_client/driver.mjs), `voice grants`,
and a real `voice chat` process killed with a question pending. The person
chose the command when they configured it, not the moment it runs: by
default (`tools.approve = "writes"`) each run asks until "yes, always";
"never" (for all, or one command in [tools.approve_commands]) runs unasked.

Each command appends a line to a marker file, so "it never ran" and "it ran
twice" are read from the disk, not from what the assistant says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from acp_sdk import SKIP_HINT, agent_env, result, run_plan, sdk_installed, updates, violations, voice_acp_argv
from killpoint import killpoints_fixture
from voice.log import events as ev
from voice.log.store import EventStore

REPO = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.timeout(180)]

killpoints = killpoints_fixture()


def command(marker: Path) -> str:
    return json.dumps(["sh", "-c", f"echo ran >> '{marker}'"])


def runs(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def call(name: str) -> str:
    """A scripted model's run_command call. Once the command ran, its own
    phrase ("Done, NAME ran.") ends the turn; declined, the model's next
    reply (`say`) answers."""
    return ('[[reply]]\nchunk_delay_ms = 0\n[[reply.tool_calls]]\nname = "run_command"\n'
            f'arguments = {{ name = "{name}" }}\n')


def say(text: str) -> str:
    return f'[[reply]]\nchunk_delay_ms = 0\ntext = "{text}"\n'


def env_for(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and k != "VOICE_DB"}
    e.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "cfg"),
             XDG_DATA_HOME=str(tmp_path / "data"), HF_HUB_OFFLINE="1", NO_PROXY="*")
    return e


def voice(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voice", *args], cwd=REPO, env=env, input=stdin,
                          capture_output=True, text=True, timeout=60)


def chat(tmp_path: Path, env: dict[str, str], config: Path, script: str, stdin: str,
         name: str = "llm") -> subprocess.CompletedProcess:
    llm = tmp_path / f"{name}.toml"
    llm.write_text(script)
    r = voice(env, "chat", "--config", str(config), "--db", str(tmp_path / "e.db"), "--new",
              "--llm", f"scripted:{llm}", stdin=stdin)
    assert r.returncode == 0, r.stderr
    return r


def logged(db: Path) -> list[ev.Event]:
    store = EventStore(db, read_only=True)
    try:
        return store.events()
    finally:
        store.close()


def answers(db: Path) -> list[tuple[str, str]]:
    return [(e.body.decision, e.body.how) for e in logged(db) if e.type == ev.APPROVAL_ANSWERED]


QUESTION = "[Should I use Run command, with name suspend? Say yes or no.]"


# -- voice chat -----------------------------------------------------------------


def test_a_configured_command_asks_first_and_no_leaves_it_unrun(tmp_path):
    env, marker = env_for(tmp_path), tmp_path / "suspended"
    config = tmp_path / "voice.toml"
    config.write_text(f"[tools.commands]\nsuspend = {command(marker)}\n")  # no approve key: the default asks
    r = chat(tmp_path, env, config, call("suspend") + say("Okay."), "suspend the computer\nno\n")
    assert QUESTION in r.stdout
    assert "[Okay, I didn't do it.]" in r.stdout
    assert runs(marker) == 0
    results = [e.body for e in logged(tmp_path / "e.db") if e.type == ev.TOOL_RESULT]
    assert [(t.name, t.status) for t in results] == [("run_command", ev.DECLINED)]
    assert not [e for e in logged(tmp_path / "e.db") if e.type == ev.TOOL_DISPATCH]
    # The control: "yes" runs it, once.
    r = chat(tmp_path, env, config, call("suspend"), "suspend the computer\nyes\n", name="llm2")
    assert QUESTION in r.stdout and "assistant: Done, suspend ran." in r.stdout
    assert runs(marker) == 1
    assert answers(tmp_path / "e.db") == [("denied", "text"), ("granted", "text")]


def test_yes_always_is_a_grant_voice_grants_lists_and_revokes(tmp_path):
    env, marker = env_for(tmp_path), tmp_path / "suspended"
    config = tmp_path / "voice.toml"
    config.write_text(f"[tools.commands]\nsuspend = {command(marker)}\n")
    r = chat(tmp_path, env, config, call("suspend") + call("suspend"), "suspend\nyes, always\nsuspend again\n")
    assert r.stdout.count("Should I") == 1, r.stdout
    assert "voice grants revoke tools.commands suspend undoes that" in r.stdout
    assert runs(marker) == 2
    assert answers(tmp_path / "e.db") == [("granted", "text"), ("granted", "always")]
    # Listed and revoked with the MCP servers' grants, in the same file, by the same command.
    assert voice(env, "grants").stdout == "tools.commands suspend: always allowed\n"
    revoked = voice(env, "grants", "revoke", "tools.commands", "suspend")
    assert revoked.returncode == 0 and "asks again" in revoked.stdout
    r = chat(tmp_path, env, config, call("suspend") + say("Okay."), "suspend\nno\n", name="llm2")
    assert QUESTION in r.stdout
    assert runs(marker) == 2


def test_never_runs_unasked_only_where_it_is_configured(tmp_path):
    env = env_for(tmp_path)
    lights, suspend = tmp_path / "lights", tmp_path / "suspended"
    config = tmp_path / "voice.toml"
    # One command opted out: it runs unasked; the other still asks.
    config.write_text(f"[tools.commands]\nlights_off = {command(lights)}\nsuspend = {command(suspend)}\n"
                      '[tools.approve_commands]\nlights_off = "never"\n')
    r = chat(tmp_path, env, config, call("lights_off") + call("suspend") + say("Okay."), "lights off\nsuspend\nno\n")
    assert "Should I use Run command, with name lights_off" not in r.stdout
    assert r.stdout.count("Should I") == 1 and QUESTION in r.stdout
    assert (runs(lights), runs(suspend)) == (1, 0)
    # All opted out, one opted back in.
    config.write_text(f"[tools]\napprove = \"never\"\n[tools.commands]\nlights_off = {command(lights)}\n"
                      f'suspend = {command(suspend)}\n[tools.approve_commands]\nsuspend = "writes"\n')
    r = chat(tmp_path, env, config, call("lights_off") + call("suspend") + say("Okay."), "lights off\nsuspend\nno\n",
             name="llm2")
    assert r.stdout.count("Should I") == 1 and QUESTION in r.stdout
    assert (runs(lights), runs(suspend)) == (2, 0)
    # Everything opted out: the old behaviour, nothing asked.
    config.write_text(f"[tools]\napprove = \"never\"\n[tools.commands]\nsuspend = {command(suspend)}\n")
    r = chat(tmp_path, env, config, call("suspend"), "suspend\n", name="llm3")
    assert "Should I" not in r.stdout and runs(suspend) == 1


@pytest.mark.parametrize("body, message", [
    ('[tools]\napprove = "sometimes"\n',
     'tools.approve = "sometimes" must be one of "destructive", "writes", "never"'),
    ('[tools.commands]\nsuspend = ["true"]\n[tools.approve_commands]\nsuspend = "ask"\n',
     'tools.approve_commands.suspend = "ask" must be one of "destructive", "writes", "never"'),
    ('[tools.commands]\nsuspend = ["true"]\n[tools.approve_commands]\nsuspnd = "never"\n',
     "tools.approve_commands.suspnd names no command of [tools.commands] (configured: suspend)"),
])
def test_a_bad_approval_value_is_one_line_naming_the_key_and_what_is_allowed(tmp_path, body, message):
    config = tmp_path / "voice.toml"
    config.write_text(body)
    r = voice(env_for(tmp_path), "config", "show", "--config", str(config))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


@pytest.mark.slow
def test_a_question_a_crash_left_pending_is_asked_again_and_no_leaves_it_unrun(tmp_path, killpoints):
    env, marker = env_for(tmp_path), tmp_path / "suspended"
    config = tmp_path / "voice.toml"
    config.write_text(f"[tools.commands]\nsuspend = {command(marker)}\n")
    (tmp_path / "llm1.toml").write_text(call("suspend"))
    (tmp_path / "llm2.toml").write_text('[[reply]]\nchunk_delay_ms = 0\ntext = "Okay."\n')

    def argv(k: int) -> list[str]:
        return ["chat", "--config", str(config), "--db", str(tmp_path / "e.db"), "--llm",
                f"scripted:{tmp_path / f'llm{k}.toml'}"]

    killed = killpoints.run(argv(1), env=env, out=tmp_path / "run1", stdin="suspend the computer\n",
                            kill_after=ev.APPROVAL_REQUESTED)
    assert killed["signal"] == 9
    again = killpoints.run(argv(2), env=env, out=tmp_path / "run2", stdin="no\n")
    assert again["rc"] == 0, again["stderr"]
    assert re.search(r"Before I stopped, \d+ seconds ago, I was asking you this\. Should I use Run command, "
                     r"with name suspend\?", again["stdout"]), again["stdout"]
    assert runs(marker) == 0
    assert answers(tmp_path / "e.db") == [("withdrawn", "restart"), ("denied", "text")]


# -- an editor, through ACP ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not sdk_installed(), reason=SKIP_HINT)
def test_an_editor_is_asked_with_kind_execute_and_its_reject_stops_the_command(tmp_path):
    marker = tmp_path / "suspended"
    env = agent_env(tmp_path)
    config = Path(env["XDG_CONFIG_HOME"]) / "voice" / "voice.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f"[tools.commands]\nsuspend = {command(marker)}\n")
    llm = tmp_path / "llm.toml"
    llm.write_text(call("suspend") + say("Okay.") + call("suspend") + call("suspend"))
    session = "$new.sessionId"
    out = run_plan(tmp_path, voice_acp_argv(tmp_path / "events.db", llm), env, [
        {"type": "initialize", "id": "init"}, {"type": "newSession", "id": "new", "cwd": str(tmp_path)},
        {"type": "prompt", "id": "no", "sessionId": session, "text": "suspend", "permission": "reject_once"},
        {"type": "prompt", "id": "always", "sessionId": session, "text": "suspend", "permission": "allow_always"},
        # Not asked again: the editor's "always" was remembered (a reject here would show it was asked).
        {"type": "prompt", "id": "again", "sessionId": session, "text": "suspend", "permission": "reject_once"},
        {"type": "close"}])
    assert violations(out) == [] and out["driverErrors"] == [], out["driverErrors"]
    assert result(out, "no") == result(out, "always") == result(out, "again") == {"stopReason": "end_turn"}
    asked = out["permissionRequests"]
    assert len(asked) == 2
    assert [r["toolCall"]["kind"] for r in asked] == ["execute", "execute"]
    assert asked[0]["toolCall"]["rawInput"] == {"name": "suspend"}
    assert runs(marker) == 2  # rejected: never ran; allowed always: ran, and again unasked
    shown = [u for u in updates(out) if u.get("sessionUpdate") == "tool_call"]
    assert [u["kind"] for u in shown] == ["execute"] * 3
    assert answers(tmp_path / "events.db") == [("denied", "acp"), ("granted", "acp"), ("granted", "always")]
    grants = json.loads((Path(env["XDG_CONFIG_HOME"]) / "voice" / "grants.json").read_text())
    assert grants == {"always": [["tools.commands", "suspend"]]}
