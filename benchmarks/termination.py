"""termination_ms: from the cancel decision to every task and process of the
turn gone.

(a) a read tool blocked on I/O: `run_process(["sleep", ...])` cancelled,
    both directly and as a tool inside an AgentLoop turn cancelled mid-tool
    (agent.cancel(), as a barge-in does); plus a tool awaiting a socket read.
(b) a SIGTERM-resistant child (`sh -c 'trap "" TERM; sleep ...'`) with
    kill_after_s = 2.0 (bounded by design at ~kill_after_s).

"Gone" is checked independently of run_process: the clock stops when the
cancelled task has returned AND no process whose command line carries this
sample's unique marker is alive in /proc (zombies count as gone: they hold
no resources but a pid and run nothing).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

import anyio

from common import stats


def _alive_with(marker: str) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            if marker.encode() not in cmd:
                continue
            state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            pids.append(int(d))
    return pids


def _argv(resistant: bool) -> tuple[list[str], str]:
    secs = f"300.{uuid.uuid4().int % 10**9:09d}"  # a unique marker that `sleep` accepts
    if resistant:
        return ["sh", "-c", f'trap "" TERM; sleep {secs}; : {secs}'], secs
    return ["sleep", secs], secs


async def _wait_started(marker: str, timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not _alive_with(marker):
            await anyio.sleep(0.005)
    await anyio.sleep(0.05)  # let the child settle into its blocking wait (and trap install)


async def _gone_after(t0: float, marker: str, done: anyio.Event) -> float:
    await done.wait()
    while _alive_with(marker):
        await anyio.sleep(0.001)
    return (time.perf_counter() - t0) * 1000


async def one_direct(resistant: bool, kill_after_s: float) -> float:
    from voice.agent.tools.processes import run_process

    argv, marker = _argv(resistant)
    done = anyio.Event()
    async with anyio.create_task_group() as tg:
        async def task():
            try:
                await run_process(argv, kill_after_s=kill_after_s)
            finally:
                done.set()

        scope = anyio.CancelScope()

        async def wrapped():
            with scope:
                await task()

        tg.start_soon(wrapped)
        await _wait_started(marker)
        t0 = time.perf_counter()
        scope.cancel()
        return await _gone_after(t0, marker, done)


async def one_agent_turn(resistant: bool, kill_after_s: float) -> float:
    """A whole AgentLoop turn, cancelled as a barge-in does, while a read tool
    runs an external process."""
    import tempfile

    from voice.agent.loop import AgentLoop
    from voice.agent.loop_settings import LoopSettings, ToolEnv
    from voice.agent.providers.scripted import ScriptedProvider, parse_replies
    from voice.agent.tools.base import Tool, ToolRegistry
    from voice.agent.tools.processes import run_process
    from voice.log.store import EventStore
    from voice.surfaces.text import TextSurface
    import io

    argv, marker = _argv(resistant)

    async def run(args, ctx):
        result = await run_process(argv, kill_after_s=ctx.kill_after_s)
        return result.stdout.decode()

    tool = Tool("look_up", "reads something slowly", {"type": "object"}, "read", run, timeout_s=600)
    provider = ScriptedProvider(parse_replies([
        {"chunk_delay_ms": 1, "text": "Let me look.", "tool_calls": [{"name": "look_up", "arguments": {}}]},
        {"chunk_delay_ms": 1, "text": "Done."},
    ], "termination bench"))
    with tempfile.TemporaryDirectory() as tmp:
        store = EventStore(Path(tmp) / "events.db")
        try:
            agent = AgentLoop(store, provider, TextSurface(out=io.StringIO()), "c-bench", ToolRegistry([tool]),
                              LoopSettings(retry_backoff_s=0.01), ToolEnv(data_dir=Path(tmp), kill_after_s=kill_after_s))
            done = anyio.Event()
            async with anyio.create_task_group() as tg:
                async def turn():
                    try:
                        await agent.run_turn("look it up")
                    finally:
                        done.set()

                tg.start_soon(turn)
                await _wait_started(marker)
                t0 = time.perf_counter()
                assert agent.cancel(), "no turn running"
                return await _gone_after(t0, marker, done)
        finally:
            store.close()


async def one_socket_read() -> float:
    """A tool awaiting a socket read that never comes (a stalled server)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    done = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def reader():
                try:
                    with scope:
                        stream = await anyio.connect_tcp("127.0.0.1", port)
                        async with stream:
                            await stream.receive()
                finally:
                    done.set()

            tg.start_soon(reader)
            await anyio.sleep(0.05)
            t0 = time.perf_counter()
            scope.cancel()
            await done.wait()
            return (time.perf_counter() - t0) * 1000
    finally:
        listener.close()


def measure(reps: int, resistant_reps: int, kill_after_s: float = 2.0) -> dict:
    async def main():
        direct = [await one_direct(False, kill_after_s) for _ in range(reps)]
        agent = [await one_agent_turn(False, kill_after_s) for _ in range(max(1, reps // 2))]
        sock = [await one_socket_read() for _ in range(reps)]
        resistant = [await one_direct(True, kill_after_s) for _ in range(resistant_reps)]
        resistant_agent = [await one_agent_turn(True, kill_after_s) for _ in range(resistant_reps // 2)]
        return direct, agent, sock, resistant, resistant_agent

    direct, agent, sock, resistant, resistant_agent = anyio.run(main, backend="asyncio")
    blocked = direct + agent + sock
    return {
        "termination_ms": stats(blocked),
        "termination_direct_ms": stats(direct),
        "termination_agent_turn_ms": stats(agent),
        "termination_socket_ms": stats(sock),
        "termination_resistant_ms": stats(resistant + resistant_agent),
        "termination_resistant_direct_ms": stats(resistant),
        "termination_resistant_agent_turn_ms": stats(resistant_agent),
        "kill_after_s": kill_after_s,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(measure(5, 2), indent=1))
