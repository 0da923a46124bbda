"""MCP tools under the stop protocol, measured (issue #23's targets):

- cancel -> `notifications/cancelled` on a stdio wire, and cancel -> the
  turn ended (`run_turn` returned, its stop recorded), over `--reps` stops of
  a slow write on the chaos server (tests/mcp_servers/chaos_server.py);
  targets <= 50 ms and <= 250 ms at p95;
- stdio servers gone at shutdown: the app's close with one polite server
  and one that ignores SIGTERM (and stdin's end); target <= 2.5 s;
- kill -9 at random commit points of a turn with an MCP write that asks
  first (`--kills` restarts on one log, answered "yes"): writes replayed
  (a door unlocked twice) and destructive calls dispatched without a grant
  in the log; target 0 and 0;
- the tool schemas' share of the context budget with 1, 3 and 10 servers
  (the default 4096-token context less the 512-token reply reserve), at the
  built-in estimate of one token per three characters.

    python benchmarks/mcp_tools.py [--reps 30] [--kills 100] [--out results-mcp.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import anyio

from common import ROOT, stats

sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from mcp_fixtures import (chaos_server_command, events, server_memory_command, server_memory_env,  # noqa: E402
                          time_server_command, wait_for_event)


def _config(**servers) -> dict:
    from voice.config import load_config_with_sources

    config = load_config_with_sources(os.devnull, env={})[0]
    config["mcp"]["servers"] = servers
    return config


def _stdio(argv: list[str], **keys) -> dict:
    return {"command": argv[0], "args": argv[1:], **keys}


async def _stops(reps: int) -> tuple[list[float], list[float], list[float]]:
    from voice.agent.providers.scripted import ScriptedProvider, parse_replies
    from voice.app import open_app
    from voice.settings import Settings
    from voice.surfaces.text import TextSurface

    wire_ms, ended_ms, server_ms = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        journal = tmp_path / "chaos.journal"
        config = _config(chaos=_stdio(chaos_server_command(journal), approve="never"))
        replies = [{"chunk_delay_ms": 0, "tool_calls": [{"name": "chaos__slow_write",
                                                         "arguments": {"seconds": 30, "label": f"w{n}"}}]}
                   for n in range(reps)]
        provider = ScriptedProvider(parse_replies(replies, "mcp bench"))
        async with open_app(Settings.from_config(config), db=tmp_path / "e.db", llm=provider, data_dir=tmp_path,
                            grants=tmp_path / "grants.json") as app:
            server = app.mcp.servers[0]
            agent = app.agent(TextSurface(out=io.StringIO()), "c-bench")
            for n in range(reps):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(agent.run_turn, f"write w{n}")
                    await wait_for_event(journal, "start", timeout=10, label=f"w{n}")
                    await anyio.sleep(0.05)
                    cancel_wall, cancel_at = time.time(), anyio.current_time()
                    agent.cancel()
                await agent.wait_idle()
                ended_ms.append((anyio.current_time() - cancel_at) * 1000)
                sent = [w for w in server.wire if w.direction == "out" and w.method == "notifications/cancelled"
                        and w.at >= cancel_at]
                wire_ms.append((sent[0].at - cancel_at) * 1000)
                seen = await wait_for_event(journal, "cancelled", timeout=5, label=f"w{n}")
                server_ms.append((seen["t"] - cancel_wall) * 1000)
    return wire_ms, ended_ms, server_ms


async def _shutdowns(reps: int) -> list[float]:
    from voice.agent.providers.scripted import ScriptedProvider, parse_replies
    from voice.app import open_app
    from voice.settings import Settings

    took = []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = Path(tmp)
            config = _config(polite=_stdio(chaos_server_command(tmp_path / "a")),
                             stubborn=_stdio(chaos_server_command(tmp_path / "b", ignore_sigterm=True)))
            provider = ScriptedProvider(parse_replies([{"text": "hi"}], "mcp bench"))
            async with open_app(Settings.from_config(config), db=tmp_path / "e.db", llm=provider, data_dir=tmp_path,
                                grants=tmp_path / "grants.json") as app:
                assert [s.state for s in app.mcp.servers] == ["running", "running"]
                started = time.monotonic()
            took.append((time.monotonic() - started) * 1000)
    return took


def _kills(kills: int, seed: int = 7) -> dict:
    """kill -9 at a random commit point, `kills` times, on one log."""
    from killpoint import KillPoints
    from voice.log import events as ev
    from voice.log.store import EventStore

    rng = random.Random(seed)
    killpoints = KillPoints()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = Path(tmp)
            journal = tmp_path / "chaos.journal"
            argv = chaos_server_command(journal)
            config = tmp_path / "voice.toml"
            config.write_text(f"[mcp.servers.chaos]\ncommand = {json.dumps(argv[0])}\nargs = {json.dumps(argv[1:])}\n")
            env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_DATA_HOME": str(tmp_path / "data"),
                   "XDG_CONFIG_HOME": str(tmp_path / "config"), "HF_HUB_OFFLINE": "1"}
            points = None
            for k in range(kills + 1):
                script = tmp_path / f"s{k}.toml"
                script.write_text('[[reply]]\nchunk_delay_ms = 0\n[[reply.tool_calls]]\nname = "chaos__unlock_door"\n'
                                  f'arguments = {{ door = "d{k}" }}\n[[reply]]\nchunk_delay_ms = 0\ntext = "Done."\n')
                argv_k = ["chat", "--config", str(config), "--db", str(tmp_path / "ev.db"), "--llm", f"scripted:{script}"]
                # A question a kill left unanswered is asked again first: "yes" answers it too.
                again = "yes\n" if (tmp_path / "ev.db").exists() and _unanswered(tmp_path / "ev.db") else ""
                kill_after = None if points is None else rng.randint(1, points)
                run = killpoints.run(argv_k, env=env, out=tmp_path / f"run{k}", stdin=f"{again}unlock d{k}\nyes\n",
                                     kill_after=kill_after)
                if points is None:
                    points = run["commits"]
            store = EventStore(tmp_path / "ev.db")
            try:
                log = store.events()
            finally:
                store.close()
            done = Counter(e["label"] for e in events(journal, "done"))
    finally:
        killpoints.close()
    granted = {e.payload["approval_id"]: e.seq for e in log
               if e.type == ev.APPROVAL_ANSWERED and e.payload["decision"] == "granted"}
    ungranted = sum(1 for e in log if e.type == ev.TOOL_DISPATCH
                    and not granted.get(e.payload["tool_call_id"], 10**12) < e.seq)
    receipts = Counter(e.payload["state"] for e in log if e.type == ev.EFFECT_RECEIPT and e.payload["phase"] == "dispatch")
    return {"kills": kills, "commit_points": points, "doors_unlocked": len(done),
            "writes_replayed": sum(n - 1 for n in done.values()), "dispatched_without_a_grant": ungranted,
            "receipts": dict(receipts), "asked_again": sum(1 for e in log if e.type == ev.APPROVAL_REQUESTED
                                                          and e.payload.get("asked_again"))}


def _unanswered(db: Path) -> bool:
    from voice.agent.approvals import unanswered
    from voice.log.store import EventStore

    store = EventStore(db, read_only=True)
    try:
        # voice chat goes on in the latest conversation, and asks again what it left unanswered there
        return bool(unanswered(store, store.latest_conversation() or "", expire_s=900.0))
    finally:
        store.close()


async def _schema_share() -> dict:
    """Tokens of the offered tool schemas, and their share of the history budget."""
    from voice.agent.providers.scripted import ScriptedProvider, parse_replies
    from voice.app import open_app
    from voice.settings import Settings
    from voice.log.window import estimate_tokens, tools_tokens

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        kinds = [("time", _stdio(time_server_command())), ("chaos", _stdio(chaos_server_command(tmp_path / "j")))]
        memory = server_memory_command()
        if memory is not None:
            kinds.append(("memory", _stdio(memory, env=server_memory_env(tmp_path))))
        for count in (1, 3, 10):
            servers = {f"{kinds[n % len(kinds)][0]}{n}": kinds[n % len(kinds)][1] for n in range(count)}
            provider = ScriptedProvider(parse_replies([{"text": "hi"}], "mcp bench"))
            async with open_app(Settings.from_config(_config(**servers)), db=tmp_path / f"e{count}.db", llm=provider, data_dir=tmp_path,
                                grants=tmp_path / "grants.json") as app:
                own = [app.tools.get(n) for n in app.tools.names()]
                builtin = tools_tokens([t.schema() for t in own if not t.source], estimate_tokens)
                mcp_tools = [t.schema() for t in app.mcp.tools()]
                tokens = tools_tokens(mcp_tools, estimate_tokens)
                budget = app.loop_settings.context_tokens - app.loop_settings.reply_tokens
                out[str(count)] = {"servers": sorted(servers), "tools": len(mcp_tools), "tokens": tokens,
                                   "share_of_budget": round(tokens / budget, 3), "budget": budget,
                                   "builtin_tokens": builtin}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--shutdowns", type=int, default=5)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results-mcp.json")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    wire, ended, server = anyio.run(_stops, args.reps, backend="asyncio")
    shutdown = anyio.run(_shutdowns, args.shutdowns, backend="asyncio")
    share = anyio.run(_schema_share, backend="asyncio")
    kills = _kills(args.kills)
    result = {"load_1min_at_start": round(load, 2), "cores": os.cpu_count(),
              "cancel_to_wire_ms": stats(wire), "cancel_to_turn_ended_ms": stats(ended),
              "cancel_to_server_saw_it_ms": stats(server), "shutdown_ms": stats(shutdown),
              "kill_restarts": kills, "schema_share": share}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
