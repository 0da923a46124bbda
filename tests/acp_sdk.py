"""Drive an ACP agent with the official TypeScript SDK as the client.

`run_plan()` writes a plan, runs tests/acp_client/driver.mjs under node
(@agentclientprotocol/sdk, installed by .ci/run into .ci/node/), and returns
what the driver wrote: every JSON-RPC line both ways, each step's result or
error, the schema violations of every message, the agent's stderr and exit.

The plan (JSON):

    argv            the agent's command line
    env             the agent's whole environment
    cwd             the agent's working directory (default: the driver's)
    steps           run in order (below)
    stepTimeoutMs   a step that takes longer fails, "timedOut" (default 20000)
    stopAfterTimeout  steps after a timed-out one are skipped (default true)
    totalTimeoutMs  the driver then stops, kills the agent and writes (default 120000)
    exitTimeoutMs   at the end: stdin is closed, then SIGTERM after this (default 5000)
    permission      the initial permission policy (default "reject_once"; below)
    readDelayMs     fs/read_text_file answers after this long (a slow disk; default 0)

Every step has "type", an optional "id" (its result can then be referred to by
later steps as "$ID" or "$ID.field.field", e.g. "$new1.sessionId"; "$$x" is a
literal "$x"), an optional "timeoutMs" and "afterMs" (a pause after it).

    initialize    protocolVersion (default the SDK's), clientCapabilities ({}),
                  clientInfo, or "params" sent as they are
    newSession    cwd, mcpServers ([]), additionalDirectories, or "params"
    loadSession   sessionId, cwd, mcpServers ([]), or "params"
    listSessions  cwd, cursor, or "params"
    request       method, params: any other request, through the SDK
    notify        method, params: any notification, through the SDK
    prompt        sessionId, prompt (content blocks as given, or a string) or text;
                  cancelAfter: "agent_message_chunk" | "tool_call" | any sessionUpdate
                      kind | "permission" | a number of ms, or
                      {"on": KIND, "count": N} / {"ms": N}: session/cancel is sent
                      when the Nth such update (of this session, since the prompt)
                      arrives, or when a session/request_permission arrives, or
                      after N ms; pending permission requests of the session are
                      then answered "cancelled", as are any that arrive later in
                      the turn;
                  via: "session" (session/cancel, default) | "request"
                      ($/cancel_request through the SDK's cancellationSignal) | "both";
                  permission: the policy (below) from this prompt on;
                  background: true returns at once (needs an id; see await)
    await         ref: the id of a background prompt; its result or error
    cancel        sessionId: send session/cancel now (and answer pending
                  permission requests "cancelled")
    permission    policy: "allow_once" | "reject_once" | "allow_always" |
                  "reject_always" (the option of that kind), {"optionId": ID},
                  "wait" (held until the turn is cancelled, or the agent sends
                  $/cancel_request for it), "cancelled" (answered so at once),
                  "error" (a JSON-RPC error), or a list of them used one per
                  request, the last one kept. A policy no option matches is
                  answered "cancelled" and noted in "oddities".
    raw           line (written verbatim to the agent's stdin, bypassing the SDK)
                  or json (a value, serialized); newline (default true);
                  responseId: the id of the response looked for (default: the id
                  of `json` when it has one, else null); expectResponse (default
                  true); waitMs (how long to look: 3000 / 500 when not expected).
                  Result: response (or null), responseIndex, received (indices of
                  the lines the agent sent meanwhile), agentExited. Use string
                  ids ("raw-1"): the SDK numbers its own requests 0, 1, 2...
    waitMs        ms
    waitFor       update (a sessionUpdate kind), count (1), sessionId: until that
                  many such updates were received in all
    close         close the agent's stdin and wait for it to exit: {code, signal}
    expectExit    wait for the agent to exit (closeStdin: true closes it first);
                  code: fail unless it exits with this code
    kill          signal (SIGTERM): kill the agent and wait

The output (JSON):

    sdk, validator  package names and versions, the schema file
    messages      [{i, t (ms since start), dir: "out" (client->agent) | "in",
                    via: "sdk" | "raw" | "agent", line, msg (parsed) | parseError}]
    steps         [{index, type, id, ok, result | error {code, message, data} |
                    error {message, timeout}, timedOut, skipped, requestId,
                    requestIndex, responseIndex, cancel {trigger, sent, t,
                    triggerIndex, indexBefore}, startedAt, endedAt}]
    updates       session/update params as the SDK's handler got them {t, sessionId, update}
    permissionRequests  [{t, requestId, sessionId, toolCall, options, policy,
                    outcome, answeredAt, answeredBecause, matched}]
    fileOps       fs/read_text_file and fs/write_text_file calls {method, params, ok, error}
    clientRequests, clientNotifications  anything else the agent sent (requests
                  answered "method not found")
    violations    [{msgIndex, dir, via, kind, method, id, source: "schema" |
                    "jsonrpc" | "json", definition, target, schemaPath, error,
                    errors [...], message}] for every message in both directions
    unmapped      messages whose method (or request) maps to no definition
    oddities      other things worth a look (extra top-level members, ...)
    schemaMap     {mapping: [{method, kind, message, dir, definition}], missing}
    sdkLog        what the SDK printed (console.error / console.warn)
    driverErrors, stderr (the agent's), exit {code, signal, t, how}, ok
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DRIVER = REPO / "tests" / "acp_client" / "driver.mjs"
NODE_MODULES = REPO / ".ci" / "node" / "node_modules"

SDK_VERSION = "2.4.0"
NPM_PACKAGES = (f"@agentclientprotocol/sdk@{SDK_VERSION}", "ajv@8.20.0", "ajv-formats@3.0.1", "zod@4.6.7")
INSTALL_COMMAND = "npm install --prefix .ci/node --no-audit --no-fund --save-exact " + " ".join(NPM_PACKAGES)
SKIP_HINT = (f"the ACP TypeScript SDK (@agentclientprotocol/sdk@{SDK_VERSION}) or node is not installed: "
             f"run .ci/run, or {INSTALL_COMMAND} (needs node and npm)")


def _version(package: str) -> str | None:
    try:
        return json.loads((NODE_MODULES / package / "package.json").read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError):
        return None


def sdk_installed() -> bool:
    """node is on PATH and .ci/node holds the pinned SDK and the validator."""
    return (shutil.which("node") is not None and _version("@agentclientprotocol/sdk") == SDK_VERSION
            and all(_version(p) is not None for p in ("ajv", "ajv-formats", "zod")))


def agent_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The agent's environment: this one, with XDG dirs under tmp_path, offline."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    for var in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME"):
        env[var] = str(tmp_path / var.lower())
        Path(env[var]).mkdir(parents=True, exist_ok=True)
    env.pop("VOICE_DB", None)
    env.update(extra)
    return env


def voice_acp_argv(db: Path, llm: str | Path) -> list[str]:
    """`voice acp` with its log in `db` and a scripted model (a reply file)."""
    spec = llm if isinstance(llm, str) and llm.startswith(("scripted:", "http")) else f"scripted:{llm}"
    return [sys.executable, "-m", "voice", "acp", "--db", str(db), "--llm", spec]


def run_plan(tmp_path: Path, argv: list[str], env: dict[str, str], steps: list[dict[str, Any]], *,
             timeout: float = 60.0, name: str = "acp", **options: Any) -> dict[str, Any]:
    """Run the steps against the agent; the driver's output. The driver stops
    itself 6 s before `timeout` (then kills the agent and writes, in < 3 s);
    the subprocess is killed at `timeout`. `options` go into the plan
    (stepTimeoutMs, permission, cwd, ...)."""
    plan_path = tmp_path / f"{name}.plan.json"
    out_path = tmp_path / f"{name}.out.json"
    plan = {"argv": [str(a) for a in argv], "env": env, "cwd": str(REPO),
            "totalTimeoutMs": int(max(1.0, timeout - 6.0) * 1000), "steps": steps, **options}
    plan_path.write_text(json.dumps(plan, indent=1), encoding="utf-8")
    out_path.unlink(missing_ok=True)
    try:
        proc = subprocess.run(["node", str(DRIVER), str(plan_path), str(out_path)], cwd=REPO,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the ACP driver did not finish within {timeout} s; its stderr: {exc.stderr!r}") from None
    if not out_path.exists():
        raise AssertionError(f"the ACP driver wrote no output (exit {proc.returncode}); stderr:\n{proc.stderr}")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))  # a raw line a test sent may nest ~1,000 deep, and the output holds it
    try:
        out = json.loads(out_path.read_text(encoding="utf-8"))
    finally:
        sys.setrecursionlimit(limit)
    out["driverStderr"] = proc.stderr
    out["driverExit"] = proc.returncode
    return out


# -- reading the output --------------------------------------------------------

def step(out: dict[str, Any], step_id: str) -> dict[str, Any]:
    """The record of the step with this id."""
    for s in out["steps"]:
        if s.get("id") == step_id:
            return s
    raise KeyError(f"no step with id {step_id!r} in {[s.get('id') for s in out['steps']]}")


def result(out: dict[str, Any], step_id: str) -> Any:
    """The result of a step that succeeded (AssertionError naming its error otherwise)."""
    s = step(out, step_id)
    assert s["ok"], f"step {step_id} ({s['type']}) failed: {s.get('error') or s.get('skipped')}"
    return s["result"]


def received(out: dict[str, Any], start: int = 0, end: int | None = None) -> list[dict[str, Any]]:
    """The parsed messages the agent sent with message index in [start, end), in order."""
    return [m["msg"] for m in out["messages"][start:end] if m["dir"] == "in" and "msg" in m]


def updates(out: dict[str, Any], kind: str | None = None, *, session: str | None = None,
            start: int = 0, end: int | None = None) -> list[dict[str, Any]]:
    """The session/update `update` objects the agent sent (on the wire), of this
    sessionUpdate kind ("agent_message_chunk", "tool_call", "tool_call_update",
    ...), of this session, with message index in [start, end)."""
    found = []
    for msg in received(out, start, end):
        if not isinstance(msg, dict) or msg.get("method") != "session/update":
            continue
        params = msg.get("params") or {}
        update = params.get("update") or {}
        if (kind is None or update.get("sessionUpdate") == kind) and (session is None or params.get("sessionId") == session):
            found.append(update)
    return found


def chunks(out: dict[str, Any], *, kind: str = "agent_message_chunk", session: str | None = None,
           start: int = 0, end: int | None = None) -> list[str]:
    """The text of each text chunk of this kind, in order."""
    return [u["content"]["text"] for u in updates(out, kind, session=session, start=start, end=end)
            if isinstance(u.get("content"), dict) and u["content"].get("type") == "text"]


def chunk_text(out: dict[str, Any], **kw: Any) -> str:
    """All text chunks (agent_message_chunk by default) joined."""
    return "".join(chunks(out, **kw))


def response_index(out: dict[str, Any], step_id: str) -> int:
    """The message index of the response to the request a step sent."""
    index = step(out, step_id).get("responseIndex")
    assert index is not None, f"step {step_id} got no response"
    return index


def violations(out: dict[str, Any], *, raw: bool = False) -> list[dict[str, Any]]:
    """The schema / JSON-RPC violations; those of lines a raw step sent on
    purpose are left out unless `raw`."""
    return [v for v in out["violations"] if raw or v.get("via") != "raw"]


def describe(out: dict[str, Any], limit: int = 60) -> str:
    """The wire and the steps, for an assertion message."""
    lines = [f"{m['i']:>3} {m['t']:>9.1f} {m['dir']:<3} {m['via']:<5} {m['line'][:300]}" for m in out["messages"][:limit]]
    if len(out["messages"]) > limit:
        lines.append(f"... {len(out['messages']) - limit} more")
    lines += [f"step {s['index']} {s['type']} {s.get('id') or ''}: "
              + (json.dumps(s.get("result"))[:300] if s.get("ok") else f"FAILED {s.get('error') or s.get('skipped')}")
              for s in out["steps"]]
    lines.append(f"exit {out.get('exit')}; driver errors {out.get('driverErrors')}")
    lines.append("agent stderr (tail): " + out.get("stderr", "")[-2000:])
    return "\n".join(lines)
