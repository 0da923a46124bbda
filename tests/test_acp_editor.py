"""`voice acp` as an editor uses it, driven by the official ACP TypeScript
SDK (@agentclientprotocol/sdk 2.4, tests/acp_client/driver.mjs), every
message of both directions checked against the SDK's schema/v1/schema.json:
reopening a thread after a restart, the editor's own MCP servers (real
processes: tests/mcp_servers/chaos_server.py), permission before acting
(granted, rejected, cancelled, remembered), attached files read through the
client, a timer ringing in its own session, a provider retry, stop reasons,
images refused with a reason, and hostile lines that leave the agent
working."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from acp_sdk import (SKIP_HINT, agent_env, chunk_text, describe, result, run_plan, sdk_installed, step, updates,
                     violations, voice_acp_argv)
from mcp_fixtures import chaos_server_command, events
from voice.log import events as ev
from voice.log.store import EventStore

pytestmark = [pytest.mark.skipif(not sdk_installed(), reason=SKIP_HINT), pytest.mark.slow]

INIT = {"type": "initialize", "id": "init", "clientCapabilities": {"fs": {"readTextFile": True,
                                                                          "writeTextFile": False}}}
LONG = " ".join(f"word{i}" for i in range(1, 61)) + "."


def agent(tmp_path: Path, script: str, name: str = "llm") -> tuple[list[str], dict[str, str]]:
    llm = tmp_path / f"{name}.toml"
    llm.write_text(script, encoding="utf-8")
    return voice_acp_argv(tmp_path / "events.db", llm), agent_env(tmp_path)


def call(tool: str, **arguments) -> str:
    return (f'[[reply]]\nchunk_delay_ms = 1\n[[reply.tool_calls]]\nname = "{tool}"\n'
            f"arguments = {json.dumps(json.dumps(arguments))}\n")  # the JSON text, as a model streams it


def say(text: str, **keys) -> str:
    keys = {"chunk_delay_ms": 1, **keys}
    return f'[[reply]]\ntext = "{text}"\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())


def chaos(journal: Path) -> dict:
    argv = chaos_server_command(journal)
    return {"name": "chaos", "command": argv[0], "args": argv[1:], "env": []}


def clean(out: dict) -> None:
    """Every message both ways fits the schema."""
    assert violations(out) == [], json.dumps(violations(out), indent=1)[:4000] + "\n" + describe(out)
    assert out["driverErrors"] == [], out["driverErrors"]


def log(tmp_path: Path) -> list[ev.Event]:
    store = EventStore(tmp_path / "events.db", read_only=True)
    try:
        return store.events()
    finally:
        store.close()


def test_initialize_says_what_the_agent_takes(tmp_path):
    argv, env = agent(tmp_path, say("unused"))
    out = run_plan(tmp_path, argv, env, [INIT, {"type": "close"}])
    caps = result(out, "init")["agentCapabilities"]
    assert caps["loadSession"] is True
    assert caps["promptCapabilities"] == {"image": False, "audio": False, "embeddedContext": True}
    assert caps["mcpCapabilities"]["http"] is True and caps["mcpCapabilities"]["sse"] is False
    clean(out)


def test_a_thread_reopens_after_a_restart_with_what_was_heard_and_the_tool_calls(tmp_path):
    argv, env = agent(tmp_path, call("get_time") + say("It is noon.") + say(LONG.replace(".", ""), chunk_delay_ms=50))
    first = run_plan(tmp_path, argv, env, [
        INIT, {"type": "newSession", "id": "new", "cwd": str(tmp_path)},
        {"type": "prompt", "id": "p1", "sessionId": "$new.sessionId", "text": "what time is it"},
        {"type": "prompt", "id": "p2", "sessionId": "$new.sessionId", "text": "count for me",
         "cancelAfter": {"on": "agent_message_chunk", "count": 3}},
        {"type": "close"}], name="first")
    session = result(first, "new")["sessionId"]
    assert result(first, "p2") == {"stopReason": "cancelled"}
    heard = chunk_text(first, session=session).removeprefix("It is noon.")
    argv, env = agent(tmp_path, say("Welcome back."), name="llm2")  # a new process on the same log
    out = run_plan(tmp_path, argv, env, [
        INIT, {"type": "loadSession", "id": "load", "sessionId": session, "cwd": str(tmp_path)},
        {"type": "prompt", "id": "p3", "sessionId": session, "text": "and now?"},
        {"type": "loadSession", "id": "missing", "sessionId": "c-nosuchthing", "cwd": str(tmp_path)},
        {"type": "listSessions", "id": "list"},
        {"type": "close"}], name="second", stopAfterTimeout=False)
    assert result(out, "load") == {}
    replayed = updates(out, end=answered_at(out, "load"))
    kinds = [u["sessionUpdate"] for u in replayed]
    assert kinds == ["user_message_chunk", "tool_call", "agent_message_chunk", "user_message_chunk",
                     "agent_message_chunk", "agent_message_chunk"], kinds
    assert replayed[0]["content"]["text"] == "what time is it"
    assert replayed[1]["status"] == "completed" and replayed[1]["title"] == "Get time"
    assert replayed[2]["content"]["text"] == "It is noon."
    assert replayed[4]["content"]["text"] == heard.strip()  # exactly what reached the client, no more
    assert replayed[5]["content"]["text"] == " [stopped]" and replayed[5]["_meta"]["voice"]["interrupted"] is True
    assert result(out, "p3") == {"stopReason": "end_turn"}
    assert chunk_text(out, session=session, start=answered_at(out, "load")) == "Welcome back."
    assert step(out, "missing")["error"]["code"] == -32002
    assert step(out, "missing")["error"]["data"]["sessionId"] == "c-nosuchthing"
    assert [s["sessionId"] for s in result(out, "list")["sessions"]] == [session]
    clean(out)


def test_the_editors_mcp_server_asks_permission_and_runs_on_allow(tmp_path):
    journal = tmp_path / "chaos.journal"
    argv, env = agent(tmp_path, call("chaos__unlock_door", door="front") + say("Unlocked.")
                      + call("chaos__unlock_door", door="back") + say("Left it."))
    out = run_plan(tmp_path, argv, env, [
        INIT, {"type": "newSession", "id": "new", "cwd": str(tmp_path), "mcpServers": [chaos(journal)]},
        {"type": "prompt", "id": "yes", "sessionId": "$new.sessionId", "text": "unlock the front door",
         "permission": "allow_once"},
        {"type": "prompt", "id": "no", "sessionId": "$new.sessionId", "text": "unlock the back door",
         "permission": "reject_once"},
        {"type": "close", "id": "end"}])
    session = result(out, "new")["sessionId"]
    assert result(out, "yes") == {"stopReason": "end_turn"} == result(out, "no")
    asked = out["permissionRequests"]
    assert [r["toolCall"]["rawInput"] for r in asked] == [{"door": "front"}, {"door": "back"}]
    assert {o["kind"] for o in asked[0]["options"]} == {"allow_once", "allow_always", "reject_once", "reject_always"}
    assert [e["label"] for e in events(journal, "done")] == ["front"]  # the rejected call never reached the server
    first_call = [u for u in updates(out, session=session) if u.get("toolCallId") == "call_1_0_0_0"]
    assert [u.get("status") for u in first_call] == ["pending", "in_progress", "completed"]
    assert first_call[0]["title"] == "unlock_door (chaos)" and first_call[-1]["rawOutput"] == "unlocked front"
    second = [u for u in updates(out, session=session) if u.get("toolCallId") == "call_2_0_0_0"]
    assert [u.get("status") for u in second] == ["pending", "failed"]
    assert "the person declined" in second[-1]["rawOutput"]["error"]
    answered = [(e.body.decision, e.body.how) for e in log(tmp_path) if e.type == ev.APPROVAL_ANSWERED]
    assert answered == [("granted", "acp"), ("denied", "acp")]
    assert result(out, "end")["code"] == 0
    assert not [e for e in events(journal, "pid") if _alive(e["pid"])], "the session's server outlived the agent"
    clean(out)


def test_a_cancel_while_permission_is_pending_withdraws_it_and_one_mid_tool_stops_the_server(tmp_path):
    journal = tmp_path / "chaos.journal"
    argv, env = agent(tmp_path, call("chaos__unlock_door", door="front")
                      + call("chaos__slow_write", seconds=30, label="slow") + say("unused"))
    out = run_plan(tmp_path, argv, env, [
        INIT, {"type": "newSession", "id": "new", "cwd": str(tmp_path), "mcpServers": [chaos(journal)]},
        {"type": "prompt", "id": "held", "sessionId": "$new.sessionId", "text": "unlock the front door",
         "permission": "wait", "cancelAfter": "permission"},
        {"type": "prompt", "id": "slow", "sessionId": "$new.sessionId", "text": "write slowly",
         "permission": "allow_once", "cancelAfter": {"on": "tool_call_update", "count": 1}, "afterMs": 500},
        {"type": "close"}])
    assert result(out, "held") == {"stopReason": "cancelled"}
    assert out["permissionRequests"][0]["outcome"] == {"outcome": "cancelled"}
    # (once, under a full suite's load, this came back end_turn within 20 s; the wire and the journal say why)
    assert result(out, "slow") == {"stopReason": "cancelled"}, describe(out) + "\n" + journal.read_text()
    assert not events(journal, "done")
    assert [e["label"] for e in events(journal, "cancelled")] == ["slow"]  # the server saw the stop
    found = log(tmp_path)
    assert [(e.body.decision, e.body.how) for e in found if e.type == ev.APPROVAL_ANSWERED] == [
        ("withdrawn", "stopped"), ("granted", "acp")]
    assert [e.body.state for e in found if e.type == ev.EFFECT_RECEIPT] == [ev.UNKNOWN]
    slow = [u for u in updates(out) if u.get("toolCallId") == "call_2_0_0_0"]
    assert slow[-1]["status"] == "failed" and slow[-1]["rawOutput"]["status"] == "cancelled"
    clean(out)


def test_allow_always_is_remembered_for_that_server_and_tool(tmp_path):
    journal = tmp_path / "chaos.journal"
    argv, env = agent(tmp_path, call("chaos__unlock_door", door="a") + say("Done.")
                      + call("chaos__unlock_door", door="b") + say("Done."))
    out = run_plan(tmp_path, argv, env, [
        INIT, {"type": "newSession", "id": "new", "cwd": str(tmp_path), "mcpServers": [chaos(journal)]},
        {"type": "prompt", "id": "a", "sessionId": "$new.sessionId", "text": "unlock a", "permission": "allow_always"},
        {"type": "prompt", "id": "b", "sessionId": "$new.sessionId", "text": "unlock b", "permission": "reject_once"},
        {"type": "close"}])
    assert len(out["permissionRequests"]) == 1
    assert [e["label"] for e in events(journal, "done")] == ["a", "b"]
    clean(out)


def test_a_linked_file_is_read_through_the_client_and_the_model_sees_its_text(tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("The launch is on Thursday.\n")
    argv, env = agent(tmp_path, say("Thursday."))
    out = run_plan(tmp_path, argv, env, [
        INIT, {"type": "newSession", "id": "new", "cwd": str(tmp_path)},
        {"type": "prompt", "id": "p", "sessionId": "$new.sessionId", "prompt": [
            {"type": "text", "text": "when is the launch?"},
            {"type": "resource_link", "name": "notes.md", "uri": notes.as_uri()},
            {"type": "resource", "resource": {"uri": "file:///spec.txt", "text": "Spec: ship it."}}]},
        {"type": "prompt", "id": "img", "sessionId": "$new.sessionId", "prompt": [
            {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="}]},
        {"type": "close"}], stopAfterTimeout=False)
    assert result(out, "p") == {"stopReason": "end_turn"}
    assert [op["params"]["path"] for op in out["fileOps"] if op["method"] == "fs/read_text_file"] == [str(notes)]
    said = [e.body.content for e in log(tmp_path) if e.type == ev.USER_MESSAGE][0]
    assert f"[file {notes}]\nThe launch is on Thursday." in said
    assert "[resource file:///spec.txt]\nSpec: ship it." in said
    error = step(out, "img")["error"]
    assert error["code"] == -32602 and "cannot take image content" in error["data"]["details"]
    clean(out)


def test_a_timer_rings_in_the_session_that_set_it(tmp_path):
    argv, env = agent(tmp_path, call("set_timer", seconds=2, label="tea") + say("Timer set.") + say("Hello two."))
    out = run_plan(tmp_path, argv, env, [
        INIT, {"type": "newSession", "id": "one", "cwd": str(tmp_path)},
        {"type": "prompt", "id": "p1", "sessionId": "$one.sessionId", "text": "a two second tea timer"},
        {"type": "newSession", "id": "two", "cwd": str(tmp_path)},
        {"type": "prompt", "id": "p2", "sessionId": "$two.sessionId", "text": "hello"},
        {"type": "waitMs", "ms": 3000},
        {"type": "close"}])
    one, two = result(out, "one")["sessionId"], result(out, "two")["sessionId"]
    assert "tea timer is done" in chunk_text(out, session=one)
    assert "timer" not in chunk_text(out, session=two)
    clean(out)


def test_a_retry_after_a_provider_error_says_the_reply_broke_off_and_stop_reasons_follow_the_model(tmp_path):
    argv, env = agent(tmp_path, say("Broken reply here.", error_after_chars=7) + say("Whole reply.")
                      + say("Cut by length", finish="length"))
    out = run_plan(tmp_path, argv, env, [
        INIT, {"type": "newSession", "id": "new", "cwd": str(tmp_path)},
        {"type": "prompt", "id": "retry", "sessionId": "$new.sessionId", "text": "hello"},
        {"type": "prompt", "id": "length", "sessionId": "$new.sessionId", "text": "go on"},
        {"type": "close"}])
    assert result(out, "retry") == {"stopReason": "end_turn"}
    text = chunk_text(out, session=result(out, "new")["sessionId"])
    assert text.startswith("Broken")
    assert "[the reply above broke off: the language model failed; trying again]" in text
    assert text.count("Broken") == 1 and "Whole reply." in text
    assert result(out, "length") == {"stopReason": "max_tokens"}
    clean(out)


DEEP = '{"jsonrpc":"2.0","id":"raw-1","method":"session/list","params":{"_meta":{"x":' + "[" * 980 + "]" * 980 + "}}}"


@pytest.mark.parametrize("line, code", [("[1,2]", -32600), ('"x"', -32600), ("3", -32600), ("null", -32600),
                                        ("{not json", -32700), ('{"jsonrpc":"2.0","id":"raw-1","method":7}', -32600),
                                        (DEEP, -32600)], ids=["batch", "string", "number", "null", "not-json",
                                                              "method-not-a-string", "nested-980-deep"])
def test_a_hostile_line_gets_its_error_and_the_agent_goes_on(tmp_path, line, code):
    argv, env = agent(tmp_path, say("Still here."))
    out = run_plan(tmp_path, argv, env, [
        # The answer carries the request's id where it could be read (JSON-RPC), else null.
        INIT, {"type": "raw", "id": "raw", "line": line, "responseId": "raw-1" if '"method":7' in line else None},
        {"type": "newSession", "id": "new", "cwd": str(tmp_path)},
        {"type": "prompt", "id": "p", "sessionId": "$new.sessionId", "text": "are you there?"},
        {"type": "close", "id": "end"}])
    assert result(out, "raw")["response"]["error"]["code"] == code
    assert result(out, "p") == {"stopReason": "end_turn"}
    assert chunk_text(out) == "Still here."
    assert result(out, "end")["code"] == 0
    assert violations(out) == [] or all(v["via"] == "raw" for v in violations(out, raw=True))


def test_a_load_refused_during_a_prompt_leaves_the_session_as_it_was(tmp_path):
    argv, env = agent(tmp_path, say(LONG, chunk_delay_ms=60) + say("Second."))
    out = run_plan(tmp_path, argv, env, [
        INIT, {"type": "newSession", "id": "new", "cwd": str(tmp_path)},
        {"type": "prompt", "id": "long", "sessionId": "$new.sessionId", "text": "count", "background": True},
        {"type": "waitFor", "update": "agent_message_chunk", "count": 2},
        {"type": "loadSession", "id": "load", "sessionId": "$new.sessionId", "cwd": str(tmp_path)},
        {"type": "prompt", "id": "second", "sessionId": "$new.sessionId", "text": "again"},
        {"type": "cancel", "sessionId": "$new.sessionId"},
        {"type": "await", "id": "done", "ref": "long"},
        {"type": "close"}], stopAfterTimeout=False)
    assert step(out, "load")["error"]["code"] == -32600
    assert step(out, "second")["error"]["code"] == -32600  # still one prompt at a time
    assert result(out, "done") == {"stopReason": "cancelled"}  # the cancel still reached it
    clean(out)


def test_an_unreadable_answer_to_the_permission_request_declines_and_the_turn_ends(tmp_path):
    journal = tmp_path / "chaos.journal"
    argv, env = agent(tmp_path, call("chaos__unlock_door", door="front") + say("I could not ask."))
    out = run_plan(tmp_path, argv, env, [
        INIT, {"type": "newSession", "id": "new", "cwd": str(tmp_path), "mcpServers": [chaos(journal)]},
        {"type": "prompt", "id": "p", "sessionId": "$new.sessionId", "text": "unlock", "permission": "error"},
        {"type": "close"}])
    assert result(out, "p") == {"stopReason": "end_turn"}
    found = log(tmp_path)
    assert [e.body.outcome for e in found if e.type == ev.TURN_END] == [ev.COMPLETED]
    assert [(e.body.decision, e.body.how) for e in found if e.type == ev.APPROVAL_ANSWERED] == [
        ("denied", "unavailable")]
    assert not events(journal, "start")
    assert [u.get("status") for u in updates(out) if u.get("toolCallId") == "call_1_0_0_0"] == ["pending", "failed"]
    clean(out)


def test_a_cancel_while_a_linked_file_is_read_runs_no_turn(tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("slow\n")
    argv, env = agent(tmp_path, say("Never said."))
    out = run_plan(tmp_path, argv, env, [
        INIT, {"type": "newSession", "id": "new", "cwd": str(tmp_path)},
        {"type": "prompt", "id": "p", "sessionId": "$new.sessionId", "cancelAfter": 300,
         "prompt": [{"type": "text", "text": "read"}, {"type": "resource_link", "name": "n", "uri": notes.as_uri()}]},
        {"type": "close"}], readDelayMs=2000)
    assert result(out, "p") == {"stopReason": "cancelled"}
    assert not [e for e in log(tmp_path) if e.type == ev.TURN_START]
    assert chunk_text(out) == ""
    clean(out)


def test_session_list_is_advertised_and_keeps_each_threads_directory(tmp_path):
    project_a, project_b = tmp_path / "a", tmp_path / "b"
    argv, env = agent(tmp_path, say("In A.") + say("In B."))
    run_plan(tmp_path, argv, env, [
        INIT, {"type": "newSession", "id": "a", "cwd": str(project_a)},
        {"type": "prompt", "sessionId": "$a.sessionId", "text": "plan for A"},
        {"type": "newSession", "id": "b", "cwd": str(project_b)},
        {"type": "prompt", "sessionId": "$b.sessionId", "text": "plan for B"},
        {"type": "close"}], name="first")
    argv, env = agent(tmp_path, say("unused"), name="llm2")  # after a restart
    out = run_plan(tmp_path, argv, env, [
        INIT, {"type": "listSessions", "id": "all"}, {"type": "listSessions", "id": "b", "cwd": str(project_b)},
        {"type": "newSession", "id": "rel", "cwd": "relative/dir"}, {"type": "close"}], stopAfterTimeout=False)
    assert "list" in result(out, "init")["agentCapabilities"]["sessionCapabilities"]
    assert [(s["cwd"], s["title"]) for s in result(out, "all")["sessions"]] == [
        (str(project_b), "plan for B"), (str(project_a), "plan for A")]
    assert [s["title"] for s in result(out, "b")["sessions"]] == ["plan for B"]
    assert step(out, "rel")["error"]["code"] == -32602
    clean(out)


def test_an_always_allow_does_not_carry_over_to_another_program_under_the_same_name(tmp_path):
    journal = tmp_path / "chaos.journal"
    impostor = chaos(tmp_path / "impostor.journal")
    impostor["args"] = impostor["args"] + ["--ignore-sigterm"]  # another command line: another program
    argv, env = agent(tmp_path, call("chaos__unlock_door", door="a") + say("Done.")
                      + call("chaos__unlock_door", door="b") + say("Done."))
    out = run_plan(tmp_path, argv, env, [
        INIT, {"type": "newSession", "id": "one", "cwd": str(tmp_path), "mcpServers": [chaos(journal)]},
        {"type": "prompt", "sessionId": "$one.sessionId", "text": "unlock a", "permission": "allow_always"},
        {"type": "newSession", "id": "two", "cwd": str(tmp_path), "mcpServers": [impostor]},
        {"type": "prompt", "sessionId": "$two.sessionId", "text": "unlock b", "permission": "reject_once"},
        {"type": "close"}])
    assert len(out["permissionRequests"]) == 2  # asked again: the grant was for the first program
    assert not events(tmp_path / "impostor.journal", "start")
    clean(out)


def answered_at(out: dict, step_id: str) -> int:
    """The message index of the agent's response to a step's request."""
    request = step(out, step_id)["requestId"]
    for m in out["messages"]:
        msg = m.get("msg")
        if m["dir"] == "in" and isinstance(msg, dict) and "method" not in msg and msg.get("id") == request:
            return m["i"]
    raise AssertionError(f"no response to {step_id}")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"
