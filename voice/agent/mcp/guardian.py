"""The guardian of one stdio MCP server: nothing the server started outlives voice.

A separate program, not a module to import: voice/agent/mcp/stdio.py runs
this file (`python -I -S`: the standard library only, started in
milliseconds) as the daemon's direct child, in a session and process group
of its own, with the server's three pipes as its stdin, stdout and stderr
and one end of a socket pair whose other end only the daemon holds.

It reads the server's argv and environment (one JSON line) from the
socket, makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`: whatever
the server starts stays in this process's tree, even one whose parent
exited or that called `setsid`, so a wrapper such as `uvx`, `npx` or a shell
script between voice and the real server hides nothing), starts the server
as its child (`PR_SET_PDEATHSIG`: the server dies with it) and answers
`started PID` or `failed ERRNO`. Then it waits for the first of:

- the socket's end: the daemon closed it to stop the server, or the daemon
  died, `kill -9` included (the kernel closes it);
- the server's own exit (a crash, or it quit);
- SIGTERM;

and stops the whole tree. On the socket's end or SIGTERM, the tree has
`stdin_grace_s` to leave by itself (its stdin closed too), then every process
in it gets SIGTERM (and SIGCONT), and SIGKILL `term_grace_s` later. After the
server's own exit, what it left behind gets SIGTERM at once and SIGKILL
`term_grace_s` later. The guardian exits once it has no child left (as a
subreaper, it has none exactly when the tree is empty), with the server's
status: its exit code, or its death by a signal, re-raised.

    python -I -S guardian.py CONTROL_FD STDIN_GRACE_S TERM_GRACE_S
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GIVE_UP_AFTER_KILL_S = 0.5  # SIGKILL rounds for a process stuck in the kernel; the daemon's bound is the backstop
POLL_S = 0.01  # between SIGKILL rounds
RESCAN_S = 0.05  # between SIGTERM rounds (each one reads /proc)


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


class Tree:
    """The server and everything under this process."""

    def __init__(self, wakeup: int) -> None:
        self.wakeup = wakeup  # readable on SIGCHLD and SIGTERM
        self.server: subprocess.Popen[bytes] | None = None
        self.status: int | None = None  # the server's wait status once reaped
        self.terminated = False  # SIGTERM came

    def reap(self) -> bool:
        """Reap every exited child; whether any child is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if self.server is not None and pid == self.server.pid:
                self.status = status

    def members(self) -> list[tuple[int, int]]:
        """(pid, start time) of every live process under this one."""
        me = os.getpid()
        children: dict[int, list[tuple[int, int]]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            stat = _stat(int(name))
            if stat is not None and stat[0] not in "ZXx":
                children.setdefault(stat[1], []).append((int(name), stat[2]))
        found, stack = [], [me]
        while stack:
            for child in children.get(stack.pop(), ()):
                found.append(child)
                stack.append(child[0])
        return found

    def wait(self, timeout: float) -> None:
        """Until a signal comes (SIGCHLD, SIGTERM) or `timeout` passes."""
        if select.select([self.wakeup], [], [], max(0.0, timeout))[0]:
            os.read(self.wakeup, 512)

    def stop(self, grace_s: float, term_grace_s: float) -> None:
        """The tree gets `grace_s` to leave, then SIGTERM, then SIGKILL
        `term_grace_s` later, round after round, until nothing is left."""
        now = time.monotonic()
        term_at, kill_at = now + grace_s, now + grace_s + term_grace_s
        termed: set[tuple[int, int]] = set()
        while self.reap():
            now = time.monotonic()
            if now >= kill_at + GIVE_UP_AFTER_KILL_S:
                return
            if now < term_at:  # woken by each exit (SIGCHLD): nothing to scan yet
                self.wait(term_at - now)
                continue
            members = self.members()
            if now >= kill_at:
                _signal(members, signal.SIGKILL)
                self.wait(POLL_S)
                continue
            fresh = [m for m in members if m not in termed]  # (one forked since the last scan too)
            _signal(fresh, signal.SIGTERM)
            _signal(fresh, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
            termed.update(fresh)
            self.wait(min(RESCAN_S, kill_at - now))


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()  # the name may hold spaces and parentheses
    try:
        return fields[0].decode(), int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _signal(members: list[tuple[int, int]], sig: int) -> None:
    for pid, start in members:
        stat = _stat(pid)
        if stat is None or stat[2] != start:
            continue  # gone, or the pid now names another process
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _read_request(control: int) -> dict:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(control, 65536)
        if not chunk:
            raise SystemExit(0)  # the daemon went before asking: nothing to start
        data += chunk
    return json.loads(data)


def _exit_as(status: int | None) -> None:
    """Exit as the server did: its code, or its death by a signal."""
    if status is None:
        os._exit(1)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal whose default is not to terminate
    os._exit(os.waitstatus_to_exitcode(status))


def main(argv: list[str]) -> None:
    control, stdin_grace_s, term_grace_s = int(argv[1]), float(argv[2]), float(argv[3])
    os.set_inheritable(control, False)
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    tree = Tree(wakeup_read)

    def on_term(signum: int, frame: object) -> None:
        tree.terminated = True

    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # (a handler, so the wakeup fd hears it)
    signal.signal(signal.SIGTERM, on_term)
    request = _read_request(control)
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def die_with_guardian() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    try:
        # Popen: the lookup on the environment's PATH, the exec error raised here, SIGPIPE back to its default.
        tree.server = subprocess.Popen(request["argv"], env=request["env"], close_fds=True,
                                       preexec_fn=die_with_guardian)
    except OSError as exc:
        os.write(control, f"failed {exc.errno or 0}\n".encode())
        raise SystemExit(127) from None
    os.write(control, f"started {tree.server.pid}\n".encode())
    # The pipes are the server's alone: its stdout ends when it (and what it started) closes it.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)

    while tree.status is None and not tree.terminated:
        ready = select.select([control, wakeup_read], [], [])[0]
        if wakeup_read in ready:
            os.read(wakeup_read, 512)
        tree.reap()
        if control in ready:
            try:
                ended = not os.read(control, 512)
            except OSError:
                ended = True
            if ended:
                break
    if tree.status is None:  # asked to stop (or voice died): stdin closed too, a moment to go by itself
        tree.stop(stdin_grace_s, term_grace_s)
    else:  # the server exited: what it left behind goes now
        tree.stop(0.0, term_grace_s)
    _exit_as(tree.status)


if __name__ == "__main__":
    main(sys.argv)
