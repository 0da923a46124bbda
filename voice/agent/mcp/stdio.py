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

Each server runs in its own session and process group (signals reach
whatever it started), and dies with the daemon (`PR_SET_PDEATHSIG`): a
`kill -9` of voice leaves no server behind.

Every message, read or written, is also shown to `on_message`, so a result that arrives
for a request we cancelled is seen and logged as late (it has no
authority: the SDK has forgotten the request by then).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import mcp_types
from mcp.shared.message import SessionMessage

# Shutdown: stdin closed, then SIGTERM to the group after STDIN_GRACE_S, then
# SIGKILL after TERM_GRACE_S; all within STOP_BOUND_S.
STDIN_GRACE_S = 0.5
TERM_GRACE_S = 1.2
STOP_BOUND_S = 2.5
LINE_LIMIT = 64 * 1024 * 1024  # one message; a longer line ends the connection
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec function that makes the child get SIGKILL when voice dies."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return preexec


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
        os.killpg(pid, sig)  # the group is the server's own (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


@asynccontextmanager
async def stdio_transport(argv: list[str], env: dict[str, str], cwd: str | None, info: StdioProcess,
                          on_message: Callable[[str, dict], None] = lambda direction, message: None,
                          ) -> AsyncIterator[tuple[object, object]]:
    """Start `argv` and yield the (read, write) streams `mcp.Client` takes.
    Raises OSError when the program cannot start (nothing ran)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env, cwd=cwd or None, start_new_session=True, preexec_fn=_die_with_parent(), limit=LINE_LIMIT)
    info.pid = proc.pid
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
                await _stop(proc, info)
            tg.cancel_scope.cancel()


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


async def _stop(proc: asyncio.subprocess.Process, info: StdioProcess) -> None:
    """stdin closed, SIGTERM, SIGKILL: gone within STOP_BOUND_S. (Its own
    waits: the transport's tasks are being cancelled with it.)"""
    with anyio.move_on_after(STOP_BOUND_S):
        if proc.returncode is None and proc.stdin is not None:
            proc.stdin.close()
        with anyio.move_on_after(STDIN_GRACE_S):
            await _exited(proc)
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGTERM)
            _signal_group(proc.pid, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
            with anyio.move_on_after(TERM_GRACE_S):
                await _exited(proc)
        # What the server started in its group goes with it, even when the leader exited by itself.
        _signal_group(proc.pid, signal.SIGKILL)
        await _exited(proc)
    info.returncode = proc.returncode
    info.exited.set()
