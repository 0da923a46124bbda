"""The pipe to a stdio MCP server: its process, started and stopped our way.

The protocol (framing aside) is the official SDK's: `mcp.Client` runs the
session, the requests and their cancellation over the two streams this
transport yields. The SDK's own `stdio_client` is not used because it
breaks two promises this program makes (docs/topics/mcp.md):

- it merges HOME, LOGNAME, PATH, SHELL, TERM and USER of the daemon into
  the server's environment; here the environment is exactly what the
  config gives (the `tools.command_env` names that are set, then the
  server's own `env`), as for `run_command`;
- its shutdown waits up to 2 s after closing stdin, 2 s after SIGTERM and
  2 s more to reap; here a server is gone within `STOP_BOUND_S` (2.5 s),
  one that ignores SIGTERM included.

Nothing a server started outlives the daemon, however it was started
(directly, or through `uvx`, `npx` or a shell script that starts the real
server as its own child): each server runs under a guardian
(voice/agent/mcp/guardian.py), a small process of ours in its own session
and process group that is a child subreaper, so the server's whole tree
stays under it. The daemon holds the only other end of a socket to it;
when that closes (the daemon stopping the server, or dying by any means,
`kill -9` included) or the server itself exits, the guardian stops every
process of the tree, within the same bound.

Every message, read or written, is also shown to `on_message`, so a result that arrives
for a request we cancelled is seen and logged as late (it has no
authority: the SDK has forgotten the request by then).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import mcp_types
from mcp.shared.message import SessionMessage

# Shutdown: stdin and the guardian's socket closed; the server's tree gets
# STDIN_GRACE_S to leave, then SIGTERM, then SIGKILL TERM_GRACE_S later (the
# guardian's doing); all within STOP_BOUND_S, the daemon's SIGKILL of the
# guardian's process group the last resort.
STDIN_GRACE_S = 0.5
TERM_GRACE_S = 1.2
STOP_BOUND_S = 2.5
GUARDIAN_BOUND_S = 2.2  # the guardian's own schedule (1.7 s to SIGKILL, then rounds) ends within it
LINE_LIMIT = 64 * 1024 * 1024  # one message; a longer line ends the connection
GUARDIAN = Path(__file__).with_name("guardian.py")


@dataclass
class StdioProcess:
    """What the connection may know of the server's process."""

    pid: int | None = None
    returncode: int | None = None
    exited: anyio.Event = field(default_factory=anyio.Event)
    stderr_tail: bytes = b""
    error: str = ""  # what went wrong on the pipe, when it was the server's doing


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the guardian's group (start_new_session), the server in it
    except (ProcessLookupError, PermissionError):
        pass


@asynccontextmanager
async def stdio_transport(argv: list[str], env: dict[str, str], cwd: str | None, info: StdioProcess,
                          on_message: Callable[[str, dict], None] = lambda direction, message: None,
                          ) -> AsyncIterator[tuple[object, object]]:
    """Start `argv` (under its guardian) and yield the (read, write) streams
    `mcp.Client` takes. Raises OSError when the program cannot start
    (nothing ran)."""
    control, theirs = socket.socketpair()  # ours is the only other end: it closes when the daemon dies
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", str(GUARDIAN), str(theirs.fileno()), str(STDIN_GRACE_S), str(TERM_GRACE_S),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env, cwd=cwd or None, start_new_session=True, pass_fds=(theirs.fileno(),), limit=LINE_LIMIT)
    except BaseException:
        control.close()
        raise
    finally:
        theirs.close()
    try:
        info.pid = await _start(control, argv, env, proc.stderr)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await _stop(proc, control, StdioProcess())  # (the server did not run: `info` stays untouched)
        raise
    read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](16)
    assert proc.stdin and proc.stdout and proc.stderr

    async def read_stdout() -> None:
        async with read_send:
            while True:
                try:
                    line = await proc.stdout.readline()
                except (ValueError, asyncio.LimitOverrunError):  # a line over LINE_LIMIT
                    info.error = f"it sent a message over {LINE_LIMIT // (1024 * 1024)} MiB (one line), more than a " \
                                 "client reads"
                    await read_send.send(ValueError(info.error))
                    return
                if not line:
                    return  # EOF: the server exited or closed stdout; the session sees the end
                if not line.strip():
                    continue
                try:
                    message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except ValueError as exc:  # not JSON-RPC: the session reports it
                    await read_send.send(exc)
                    continue
                on_message("in", message.model_dump(by_alias=True, mode="json", exclude_none=True))
                await read_send.send(SessionMessage(message))

    async def write_stdin() -> None:
        async with write_receive:
            async for item in write_receive:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                try:
                    proc.stdin.write(data.encode())
                    await proc.stdin.drain()
                except (BrokenPipeError, ConnectionResetError):
                    return  # the server is gone: its requests end as the read side closes
                # Shown once written: a call the pipe refused was never sent.
                on_message("out", item.message.model_dump(by_alias=True, mode="json", exclude_none=True))

    async def keep_stderr() -> None:
        # Drained so the server never blocks on a full pipe; the tail explains a failed start.
        while chunk := await proc.stderr.read(4096):
            info.stderr_tail = (info.stderr_tail + chunk)[-2000:]

    async def watch_exit() -> None:
        await _exited(proc)
        info.returncode = proc.returncode
        info.exited.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read_stdout)
        tg.start_soon(write_stdin)
        tg.start_soon(keep_stderr)
        tg.start_soon(watch_exit)
        try:
            yield read_receive, write_send
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(proc, control, info)
            tg.cancel_scope.cancel()


async def _start(control: socket.socket, argv: list[str], env: dict[str, str],
                 stderr: asyncio.StreamReader | None) -> int:
    """Hand the guardian the server's argv and environment (exactly these:
    its own interpreter may add to its environment) and wait for its answer:
    the server's pid, or the error that kept it from starting."""
    control.setblocking(False)
    request = memoryview(json.dumps({"argv": argv, "env": env}).encode() + b"\n")
    while request:
        await anyio.wait_writable(control)
        try:
            request = request[control.send(request):]
        except BlockingIOError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break  # it ended: said below
    answer = b""
    while not answer.endswith(b"\n"):
        await anyio.wait_readable(control)
        try:
            chunk = control.recv(256)
        except BlockingIOError:
            continue
        except ConnectionResetError:
            chunk = b""
        if not chunk:  # it could not run (its own traceback on stderr)
            said = b""
            with anyio.move_on_after(1.0):
                said = await stderr.read(4096) if stderr is not None else b""
            tail = said.decode("utf-8", "replace").strip().splitlines()
            raise OSError(f"the guardian of {argv[0]!r} ended before starting it" + (f": {tail[-1]}" if tail else ""))
        answer += chunk
    word, _, number = answer.decode().strip().partition(" ")
    if word == "started":
        return int(number)
    code = int(number)
    raise OSError(code, os.strerror(code), argv[0])


async def _exited(proc: asyncio.subprocess.Process) -> None:
    """Until the process has exited and been reaped. Not proc.wait(): that
    also waits for the pipes' EOF, which a child the server left behind can
    hold open. A pidfd becomes readable when the process exits."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        pidfd = None  # already reaped
    if pidfd is not None:
        try:
            await anyio.wait_readable(pidfd)
        finally:
            os.close(pidfd)
    while proc.returncode is None:  # asyncio's child watcher reaps it a moment later
        await anyio.sleep(0.005)


async def _stop(proc: asyncio.subprocess.Process, control: socket.socket, info: StdioProcess) -> None:
    """stdin and the guardian's socket closed: the guardian takes the tree
    down (see its schedule) and exits; gone within STOP_BOUND_S. (Its own
    waits: the transport's tasks are being cancelled with it.)"""
    with anyio.move_on_after(STOP_BOUND_S):
        if proc.returncode is None and proc.stdin is not None:
            proc.stdin.close()
        control.close()
        with anyio.move_on_after(GUARDIAN_BOUND_S):
            await _exited(proc)
        if proc.returncode is None:  # the guardian is stuck: its group (it leads it) goes at once
            _signal_group(proc.pid, signal.SIGKILL)
        await _exited(proc)
    info.returncode = proc.returncode
    info.exited.set()
