"""The ACP harness (tests/acp_sdk.py, tests/acp_client/driver.mjs): the
official TypeScript SDK as the client of `voice acp`, every message of both
directions checked against the SDK's schema/v1/schema.json.

Against the agent: a prompt that ends its turn and a cancel after the first
chunk (tests/test_acp_editor.py has the rest, hostile lines included). Against a stub agent (a
script here): that the harness does report violations, answers permission
requests per its policy (and "cancelled" once it cancels the turn), and
serves fs/read_text_file and fs/write_text_file."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from acp_sdk import (SKIP_HINT, agent_env, chunk_text, chunks, describe, response_index, result, run_plan,
                     sdk_installed, step, updates, violations, voice_acp_argv)

pytestmark = pytest.mark.skipif(not sdk_installed(), reason=SKIP_HINT)

LONG = " ".join(f"word{i}" for i in range(1, 61)) + "."


def voice_acp(tmp_path: Path, script: str) -> tuple[list[str], dict[str, str]]:
    llm = tmp_path / "llm.toml"
    llm.write_text(script, encoding="utf-8")
    return voice_acp_argv(tmp_path / "events.db", llm), agent_env(tmp_path)


def assert_schema_clean(out: dict, *, answers: tuple[int, ...] = ()) -> None:
    """No violation, nothing unmapped but the responses at `answers` (the
    id-null answers to raw lines, which answer no request)."""
    assert out["schemaMap"]["missing"] == [], out["schemaMap"]["missing"]
    assert violations(out) == [], json.dumps(violations(out), indent=1)[:6000] + "\n" + describe(out)
    assert [u for u in out["unmapped"] if u["msgIndex"] not in answers] == [], out["unmapped"]
    assert out["driverErrors"] == [], out["driverErrors"]


def test_prompt_ends_turn_with_the_scripted_text(tmp_path):
    argv, env = voice_acp(tmp_path, '[[reply]]\nchunk_delay_ms = 1\ntext = "Hello there."\n')
    out = run_plan(tmp_path, argv, env, [
        {"type": "initialize", "id": "init", "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": False}}},
        {"type": "newSession", "id": "new1", "cwd": str(tmp_path), "mcpServers": []},
        {"type": "prompt", "id": "p1", "sessionId": "$new1.sessionId", "prompt": [{"type": "text", "text": "hi"}]},
        {"type": "close", "id": "end"},
    ])
    assert result(out, "init")["protocolVersion"] == 1, describe(out)
    session = result(out, "new1")["sessionId"]
    assert result(out, "p1") == {"stopReason": "end_turn"}, describe(out)
    assert chunk_text(out, session=session) == "Hello there.", describe(out)
    # Every update of the turn precedes the prompt's response.
    assert updates(out, start=response_index(out, "p1")) == []
    # The SDK's own (zod) parse took every session/update the wire carried.
    assert len(out["updates"]) == len(updates(out)) > 0
    assert result(out, "end") == {"code": 0, "signal": None}, out["stderr"][-3000:]
    assert_schema_clean(out)


def test_cancel_after_the_first_chunk(tmp_path):
    argv, env = voice_acp(tmp_path, f'[[reply]]\nchunk_delay_ms = 50\ntext = "{LONG}"\n')
    out = run_plan(tmp_path, argv, env, [
        {"type": "initialize"},
        {"type": "newSession", "id": "new1", "cwd": str(tmp_path)},
        {"type": "prompt", "id": "p1", "sessionId": "$new1.sessionId", "text": "count",
         "cancelAfter": "agent_message_chunk"},
        {"type": "waitMs", "ms": 600},  # anything of the cancelled turn would arrive meanwhile
        {"type": "close", "id": "end"},
    ])
    assert result(out, "p1") == {"stopReason": "cancelled"}, describe(out)
    cancel = step(out, "p1")["cancel"]
    end = response_index(out, "p1")
    assert cancel["sent"] and "error" not in cancel and cancel["indexBefore"] <= end, describe(out)
    sent = [m["i"] for m in out["messages"] if m["dir"] == "out" and (m.get("msg") or {}).get("method") == "session/cancel"]
    assert len(sent) == 1 and sent[0] < end
    assert chunks(out, start=end) == [], describe(out)
    received = chunk_text(out, end=end)
    assert received and LONG.startswith(received) and received != LONG, received
    assert result(out, "end") == {"code": 0, "signal": None}, out["stderr"][-3000:]
    assert_schema_clean(out)


# -- the harness itself, against a stub agent -------------------------------------

STUB = textwrap.dedent('''
    """A stub ACP agent for the harness's own tests. MODE (argv[1]):
    "bad" sends messages that break the schema; "good" asks permission for a
    tool call on every prompt (and reads and writes files on "copy:PATH")."""
    import json, sys

    MODE = sys.argv[1]
    OPTIONS = [{"optionId": "yes-once", "name": "Allow", "kind": "allow_once"},
               {"optionId": "yes-always", "name": "Always", "kind": "allow_always"},
               {"optionId": "no-once", "name": "Reject", "kind": "reject_once"},
               {"optionId": "no-always", "name": "Never", "kind": "reject_always"}]

    def send(msg):
        sys.stdout.write(json.dumps(dict(jsonrpc="2.0", **msg)) + "\\n")
        sys.stdout.flush()

    def update(sid, u):
        send({"method": "session/update", "params": {"sessionId": sid, "update": u}})

    def say(sid, text):
        update(sid, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})

    turn = None  # {"id", "sid", "stage", "path"}
    n = 0
    for line in sys.stdin:
        msg = json.loads(line)
        method, mid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            version = "one" if MODE == "bad" else 1
            send({"id": mid, "result": {"protocolVersion": version, "agentCapabilities": {"loadSession": False}}})
        elif method == "session/new":
            send({"id": mid, "result": {"sessionId": 5 if MODE == "bad" else "s-1"}})
        elif method == "session/prompt" and MODE == "bad":
            update(params["sessionId"], {"sessionUpdate": "bogus_kind"})
            send({"method": "_stub/ping", "params": {}})
            send({"id": mid, "result": {"stopReason": "done"}})
        elif method == "session/prompt":
            sid, text = params["sessionId"], params["prompt"][0]["text"]
            n += 1
            if text.startswith("copy:"):
                turn = {"id": mid, "sid": sid, "stage": "read", "path": text[5:]}
                send({"id": "read-1", "method": "fs/read_text_file", "params": {"sessionId": sid, "path": turn["path"]}})
                continue
            call = f"call-{n}"
            update(sid, {"sessionUpdate": "tool_call", "toolCallId": call, "title": "delete", "status": "pending"})
            turn = {"id": mid, "sid": sid, "stage": "ask", "call": call}
            send({"id": f"perm-{n}", "method": "session/request_permission",
                  "params": {"sessionId": sid, "options": OPTIONS,
                             "toolCall": {"toolCallId": call, "title": "delete"}}})
        elif method == "session/cancel":
            if turn and turn["stage"] == "ask":
                turn["cancelled"] = True
        elif method is None and turn and turn["stage"] == "ask":
            outcome = msg["result"]["outcome"]
            if outcome["outcome"] == "selected":
                say(turn["sid"], "chose " + outcome["optionId"])
                status, stop = "completed", "end_turn"
            else:
                status, stop = "failed", "cancelled"
            update(turn["sid"], {"sessionUpdate": "tool_call_update", "toolCallId": turn["call"], "status": status})
            send({"id": turn["id"], "result": {"stopReason": stop}})
            turn = None
        elif method is None and turn and turn["stage"] == "read":
            content = msg["result"]["content"]
            turn["stage"] = "write"
            send({"id": "write-1", "method": "fs/write_text_file",
                  "params": {"sessionId": turn["sid"], "path": turn["path"] + ".copy", "content": content.upper()}})
        elif method is None and turn and turn["stage"] == "write":
            say(turn["sid"], "copied" if "result" in msg else "failed")
            send({"id": turn["id"], "result": {"stopReason": "end_turn"}})
            turn = None
        elif mid is not None and method is not None:
            send({"id": mid, "error": {"code": -32601, "message": "Method not found"}})
''')


def stub(tmp_path: Path, mode: str) -> list[str]:
    path = tmp_path / "stub_agent.py"
    path.write_text(STUB, encoding="utf-8")
    return [sys.executable, str(path), mode]


def test_the_harness_reports_what_breaks_the_schema(tmp_path):
    out = run_plan(tmp_path, stub(tmp_path, "bad"), agent_env(tmp_path), [
        {"type": "initialize"},
        {"type": "newSession", "id": "new1", "cwd": str(tmp_path)},
        {"type": "prompt", "id": "p1", "sessionId": "$new1.sessionId", "text": "hi"},
        {"type": "raw", "line": "{not json", "expectResponse": False, "waitMs": 100},
        {"type": "close"},
    ], stepTimeoutMs=5000)
    found = {(v.get("definition"), v["error"]) for v in violations(out)}
    assert ("#/$defs/InitializeResponse", "result/protocolVersion must be integer") in found, found
    assert ("#/$defs/NewSessionResponse", "result/sessionId must be string") in found, found
    assert ("#/$defs/SessionNotification", "params/sessionId must be string") in found, found
    assert any(d == "#/$defs/PromptResponse" and "stopReason" in e for d, e in found), found
    bogus, = [v for v in violations(out) if v.get("method") == "session/update"]
    assert any(e["instancePath"].startswith("/update") for e in bogus["errors"]), bogus["errors"]
    # The extension notification maps to no definition: reported, not passed.
    assert [(u["method"], u["reason"]) for u in out["unmapped"]] == [("_stub/ping", "extension method")]
    # The line sent wrong on purpose is a violation too, marked as raw.
    raw, = [v for v in out["violations"] if v["via"] == "raw"]
    assert raw["source"] == "json" and raw["message"] == "{not json"


def test_the_harness_answers_permission_requests_and_cancels_them(tmp_path):
    out = run_plan(tmp_path, stub(tmp_path, "good"), agent_env(tmp_path), [
        {"type": "initialize", "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}}},
        {"type": "newSession", "id": "new1", "cwd": str(tmp_path)},
        {"type": "permission", "policy": ["allow_once", "reject_always"]},
        {"type": "prompt", "id": "p1", "sessionId": "$new1.sessionId", "text": "one"},
        {"type": "prompt", "id": "p2", "sessionId": "$new1.sessionId", "text": "two"},
        {"type": "prompt", "id": "p3", "sessionId": "$new1.sessionId", "text": "three", "permission": "wait",
         "cancelAfter": "permission"},
        {"type": "prompt", "id": "p4", "sessionId": "$new1.sessionId", "text": "four", "permission": {"optionId": "yes-always"}},
        {"type": "close"},
    ], stepTimeoutMs=5000)
    assert [result(out, p)["stopReason"] for p in ("p1", "p2", "p3", "p4")] == ["end_turn", "end_turn", "cancelled", "end_turn"], describe(out)
    assert [p["outcome"] for p in out["permissionRequests"]] == [
        {"outcome": "selected", "optionId": "yes-once"},
        {"outcome": "selected", "optionId": "no-always"},
        {"outcome": "cancelled"},
        {"outcome": "selected", "optionId": "yes-always"},
    ]
    assert chunks(out) == ["chose yes-once", "chose no-always", "chose yes-always"]
    # The held request was answered "cancelled" after session/cancel went out.
    wire = [(m["dir"], m.get("msg", {}).get("method"), m.get("msg", {}).get("id")) for m in out["messages"]]
    cancel = wire.index(("out", "session/cancel", None))
    answer = wire.index(("out", None, "perm-3"))
    assert wire.index(("in", "session/request_permission", "perm-3")) < cancel < answer
    assert out["permissionRequests"][2]["answeredBecause"].startswith("session/cancel")
    assert_schema_clean(out)


def test_the_harness_serves_file_reads_and_writes(tmp_path):
    source = tmp_path / "notes.txt"
    source.write_text("some notes\n", encoding="utf-8")
    out = run_plan(tmp_path, stub(tmp_path, "good"), agent_env(tmp_path), [
        {"type": "initialize", "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}}},
        {"type": "newSession", "id": "new1", "cwd": str(tmp_path)},
        {"type": "prompt", "id": "p1", "sessionId": "$new1.sessionId", "text": f"copy:{source}"},
        {"type": "close"},
    ], stepTimeoutMs=5000)
    assert result(out, "p1") == {"stopReason": "end_turn"}, describe(out)
    assert chunks(out) == ["copied"]
    assert [(f["method"], f["ok"]) for f in out["fileOps"]] == [("fs/read_text_file", True), ("fs/write_text_file", True)]
    assert (tmp_path / "notes.txt.copy").read_text(encoding="utf-8") == "SOME NOTES\n"
    assert_schema_clean(out)
