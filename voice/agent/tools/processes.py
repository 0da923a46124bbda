"""Run an external program so that "stop" reaches it (docs/ARCHITECTURE.md, "The cancellation protocol").

`run_process` starts the program in its own process group and session (never
through a shell). If the awaiting task is cancelled, or `timeout_s` passes, at
any wait (spawning, writing stdin to a child that does not read, reading its
output, waiting for its exit), everything the run started is stopped: SIGTERM
(and SIGCONT, so a stopped process can act on it) to the group and to every
descendant found, then SIGKILL after `kill_after_s`, repeated until nothing
is left. The clean-up is shielded and bounded by `kill_after_s + 1` s; then
the cancellation (or a `ProcessTimeoutError`) propagates.

What belongs to a run is collected from /proc before any signal is sent, and
again on every round, so a process forked meanwhile is caught too:

* members of the child's process group or session;
* descendants by parent links (from the child and from everything found
  before, so the children of an orphan are found as well);
* processes whose environment carries this run's random tag (inherited by
  every descendant, even one that called `setsid` and whose parent exited);
* processes holding the write end of this run's stdout/stderr pipes (the ones
  that would keep a read blocked, even with a scrubbed environment).

Each process is identified by (pid, start time), so a reused pid is never
signalled. The child is reaped; orphaned descendants are reaped by init.

A run that ends on its own (the child exited and its output reached EOF)
leaves alone whatever it started in the background: that is the command's
business. Output is kept up to `OUTPUT_CAP` bytes per stream (the last bytes
are kept; the pipes are drained to the end so the child never blocks on a
full pipe).
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import signal
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import anyio

from voice.paths import user_umask

OUTPUT_CAP = 64 * 1024
TAG_VARIABLE = "VOICE_PROCESS_TAG"
_POLL_S = 0.01
_READ_CHUNK = 64 * 1024


@dataclass(frozen=True)
class ProcessResult:
    returncode: int | None  # negative: killed by that signal; None only if it could not be reaped
    stdout: bytes  # the last OUTPUT_CAP bytes
    stderr: bytes
    pid: int
    killed: bool  # True if we had to signal it (only on a timeout's result)
    duration_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False


class ProcessTimeoutError(TimeoutError):
    """`timeout_s` passed; everything the run started has been stopped."""

    def __init__(self, message: str, result: ProcessResult) -> None:
        super().__init__(message)
        self.result = result


async def run_process(
    argv: list[str],
    *,
    kill_after_s: float,
    stdin: bytes | None = None,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
) -> ProcessResult:
    """Run `argv` to completion and return its exit status and output.

    `env` is the child's whole environment (default: this process's); the
    run's tag is added to it. The child gets the user's own umask back
    (`voice.paths.user_umask`), not the service's private one.

    Raises the spawn error (FileNotFoundError, PermissionError, ...) if the
    program cannot start: then nothing ran. Raises `ProcessTimeoutError` (a
    `TimeoutError`) after `timeout_s`, and re-raises a cancellation, in both
    cases only once every process of the run is gone (or the clean-up bound
    of `kill_after_s + 1` s has passed).
    """
    if not argv:
        raise ValueError("argv is empty")
    if kill_after_s < 0:
        raise ValueError("kill_after_s must be >= 0")
    tag = secrets.token_hex(16)
    env = {**(os.environ if env is None else env), TAG_VARIABLE: tag}
    run = _Run(f"{TAG_VARIABLE}={tag}".encode())
    out, err = _Tail(OUTPUT_CAP), _Tail(OUTPUT_CAP)
    started = time.monotonic()
    finished = False
    spawn_failed = False
    try:
        with anyio.move_on_after(math.inf if timeout_s is None else timeout_s):
            # The fork and exec happen synchronously in here; what remains is
            # connecting the pipes (a few loop iterations). Shielded (and
            # bounded) so that a cancel arriving meanwhile is acted on with
            # the pid known: SIGTERM to the group first, not asyncio's bare
            # SIGKILL of the child alone.
            with anyio.CancelScope(shield=True, deadline=anyio.current_time() + kill_after_s + 1.0):
                try:
                    proc = await asyncio.create_subprocess_exec(
                        *argv,
                        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                        start_new_session=True,
                        env=env,
                        umask=user_umask(),
                    )
                except OSError:
                    spawn_failed = True  # nothing started
                    raise
                run.started(proc)
            if run.proc is None:  # the bound passed while spawning: asyncio killed the child
                raise RuntimeError(f"{argv[0]} did not start within {kill_after_s + 1.0} s")
            proc = run.proc
            async with anyio.create_task_group() as tg:
                if stdin is not None:
                    assert proc.stdin is not None
                    tg.start_soon(_feed, proc.stdin, stdin)
                assert proc.stdout is not None and proc.stderr is not None
                tg.start_soon(_drain, proc.stdout, out)
                tg.start_soon(_drain, proc.stderr, err)
            returncode = await proc.wait()
            finished = True
    finally:
        if not finished and not spawn_failed:
            await run.terminate(kill_after_s)
    duration = time.monotonic() - started
    if not finished:  # the timeout's scope swallowed its own cancellation
        proc_pid = run.proc.pid if run.proc is not None else -1
        result = ProcessResult(
            returncode=run.proc.returncode if run.proc is not None else None,
            stdout=bytes(out.buf),
            stderr=bytes(err.buf),
            pid=proc_pid,
            killed=run.signalled,
            duration_s=duration,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
        )
        raise ProcessTimeoutError(f"{argv[0]} ran past {timeout_s} s and was stopped", result)
    return ProcessResult(
        returncode=returncode,
        stdout=bytes(out.buf),
        stderr=bytes(err.buf),
        pid=proc.pid,
        killed=False,
        duration_s=duration,
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
    )


class _Tail:
    def __init__(self, cap: int) -> None:
        self.buf = bytearray()
        self.cap = cap
        self.truncated = False

    def add(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > self.cap:
            del self.buf[: len(self.buf) - self.cap]
            self.truncated = True


async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    try:
        if data:
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the child exited or closed its stdin without reading it all


async def _drain(reader: asyncio.StreamReader, tail: _Tail) -> None:
    while chunk := await reader.read(_READ_CHUNK):
        tail.add(chunk)


# ---------------------------------------------------------------- /proc


@dataclass(frozen=True)
class _Stat:
    state: str
    ppid: int
    pgrp: int
    session: int
    start: int  # clock ticks after boot: (pid, start) names one process


def _read_stat(pid: int) -> _Stat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()  # the name may hold spaces and parentheses
    try:
        return _Stat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def _alive(pid: int, start: int) -> bool:
    st = _read_stat(pid)
    return st is not None and st.start == start and st.state not in "ZXx"


def _has_tag(pid: int, tag: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return tag in f.read()
    except OSError:  # gone, or not ours to read
        return False


def _writes_pipe(pid: int, pipes: frozenset[str]) -> bool:
    if not pipes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") not in pipes:
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as f:
                info = f.read()
        except OSError:
            continue
        for line in info.splitlines():
            if line.startswith(b"flags:"):
                if int(line.split()[1], 8) & os.O_ACCMODE != os.O_RDONLY:
                    return True
                break
    return False


def _scan(
    group: int | None, tag: bytes, pipes: frozenset[str], known: dict[int, int]
) -> tuple[dict[int, int], bool]:
    """(pid -> start time of every live process that belongs to the run,
    whether the run's process group still has a live member)."""
    me = os.getpid()
    stats: dict[int, _Stat] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}, True  # cannot tell: assume it has
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        st = _read_stat(int(name))
        if st is not None and st.state not in "ZXx":
            stats[int(name)] = st
    ours: set[int] = set()
    for pid, st in stats.items():
        if known.get(pid) == st.start:
            ours.add(pid)
        elif group is not None and group in (st.pgrp, st.session) and not (pid == group and group in known):
            ours.add(pid)  # (the leader itself is known by its start time; a reused pid is not ours)
        elif _has_tag(pid, tag) or _writes_pipe(pid, pipes):
            ours.add(pid)
    children: dict[int, list[int]] = defaultdict(list)
    for pid, st in stats.items():
        children[st.ppid].append(pid)
    stack = list(ours)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in ours:
                ours.add(child)
                stack.append(child)
    in_group = group is not None and any(stats[pid].pgrp == group for pid in ours)
    return {pid: stats[pid].start for pid in ours}, in_group


def _pipe_names(proc: asyncio.subprocess.Process) -> frozenset[str]:
    """'pipe:[inode]' of the child's stdout and stderr pipes."""
    names = set()
    transport = getattr(proc, "_transport", None)  # asyncio keeps the pipes there
    for fd in (1, 2):
        try:
            pipe = transport.get_pipe_transport(fd).get_extra_info("pipe")  # type: ignore[union-attr]
            names.add(f"pipe:[{os.fstat(pipe.fileno()).st_ino}]")
        except (AttributeError, OSError, ValueError):
            continue  # degrade: the other criteria still apply
    return frozenset(names)


class _Run:
    """Everything one run started, and how to make it stop."""

    def __init__(self, tag: bytes) -> None:
        self.tag = tag
        self.proc: asyncio.subprocess.Process | None = None
        self.group: int | None = None
        self.pipes: frozenset[str] = frozenset()
        self.known: dict[int, int] = {}  # pid -> start time
        self.termed: set[tuple[int, int]] = set()
        self.signalled = False
        self.group_alive = True

    def started(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.group = proc.pid  # start_new_session: the child leads its group and session
        self.pipes = _pipe_names(proc)
        st = _read_stat(proc.pid)
        if st is not None:
            self.known[proc.pid] = st.start

    async def terminate(self, kill_after_s: float) -> None:
        try:
            with anyio.CancelScope(shield=True) as scope:
                scope.deadline = anyio.current_time() + kill_after_s + 1.0
                kill_at = math.inf  # kill_after_s from the first SIGTERM, not from before the scan that finds whom
                while True:
                    found, self.group_alive = await anyio.to_thread.run_sync(
                        _scan, self.group, self.tag, self.pipes, dict(self.known)
                    )
                    self.known.update(found)
                    alive = self._alive()
                    if not alive:
                        break
                    if anyio.current_time() >= kill_at:
                        self._signal(signal.SIGKILL, alive)
                    else:
                        fresh = alive - self.termed
                        if fresh:
                            if not self.termed:
                                kill_at = anyio.current_time() + kill_after_s
                            self._signal(signal.SIGTERM, fresh)
                            self._signal(signal.SIGCONT, fresh)
                            self.termed |= fresh
                    await anyio.sleep(_POLL_S)
                if self.proc is not None:
                    stdin = self.proc.stdin
                    if stdin is not None and not stdin.transport.is_closing():
                        stdin.transport.abort()  # drop input nobody will read
                    await self.proc.wait()  # reap the child
        finally:
            # the bound passed, or something failed: a last SIGKILL, without waiting
            self._signal(signal.SIGKILL, self._alive())

    def _alive(self) -> set[tuple[int, int]]:
        alive = {(pid, start) for pid, start in self.known.items() if _alive(pid, start)}
        if self.proc is not None and self.proc.returncode is None and self.proc.pid not in self.known:
            alive.add((self.proc.pid, -1))  # /proc could not be read: the child still counts
        return alive

    def _signal(self, sig: int, targets: set[tuple[int, int]]) -> None:
        if not targets:
            return
        self.signalled = True
        if self.group is not None and self.group_alive:  # (an empty group's number may be reused)
            try:
                os.killpg(self.group, sig)  # also reaches a member forked since the scan
            except (ProcessLookupError, PermissionError):
                pass
        for pid, start in targets:
            if start != -1 and not _alive(pid, start):
                continue  # gone, or the pid now names another process
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
