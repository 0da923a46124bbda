"""Helpers for tests that run real MCP servers as processes: where the test
servers in tests/mcp_servers/ are and how to start them, what their journals
say (one JSON line per event, synced as it happens, so what a server saw is
evidence even after it died), a Home Assistant stand-in on a free port, and
the argv of two third-party servers: the npm package
@modelcontextprotocol/server-memory that .ci/run installs into .ci/node/, and
the mcp-server-time console script of this venv."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
SERVERS = Path(__file__).resolve().parent / "mcp_servers"
CHAOS_SERVER = SERVERS / "chaos_server.py"
LATE_SERVER = SERVERS / "late_server.py"
HOME_ASSISTANT = SERVERS / "home_assistant.py"

HOME_ASSISTANT_PATH = "/api/mcp"
HOME_ASSISTANT_START_LIMIT_S = 20.0
STOP_LIMIT_S = 5.0

SERVER_MEMORY_VERSION = "2026.8.31"
SERVER_MEMORY_ENTRY = REPO / ".ci/node/node_modules/@modelcontextprotocol/server-memory/dist/index.js"
SERVER_MEMORY_INSTALL_HINT = (
    "@modelcontextprotocol/server-memory is not installed: run .ci/run, or "
    f"npm install --prefix .ci/node --no-audit --no-fund @modelcontextprotocol/server-memory@{SERVER_MEMORY_VERSION}"
    " (needs node and npm)"
)


def chaos_server_command(journal: Path, *, ignore_sigterm: bool = False, crash_on_start: bool = False) -> list[str]:
    argv = [sys.executable, str(CHAOS_SERVER), "--journal", str(journal)]
    if ignore_sigterm:
        argv.append("--ignore-sigterm")
    if crash_on_start:
        argv.append("--crash-on-start")
    return argv


def late_server_command(journal: Path) -> list[str]:
    return [sys.executable, str(LATE_SERVER), "--journal", str(journal)]


def read_journal(path: Path) -> list[dict[str, Any]]:
    """Every whole line of a server's journal, oldest first ([] before the
    server wrote any). A line still being written (no newline yet) is left
    for the next read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n") and line.strip()]


def events(path: Path, name: str) -> list[dict[str, Any]]:
    return [entry for entry in read_journal(path) if entry["event"] == name]


async def wait_for_event(path: Path, name: str, *, timeout: float, **fields: Any) -> dict[str, Any]:
    """The first journal entry with event `name` (and these field values),
    polled for; TimeoutError after `timeout` seconds, naming what the journal
    held instead."""
    try:
        with anyio.fail_after(timeout):
            while True:
                for entry in events(path, name):
                    if all(entry.get(key) == value for key, value in fields.items()):
                        return entry
                await anyio.sleep(0.01)
    except TimeoutError:
        raise TimeoutError(f"no {name!r} {fields} in {path} within {timeout} s; it holds {read_journal(path)}") from None


def server_pid(path: Path) -> int | None:
    """The process id a test server logged at start, or None before it did."""
    found = events(path, "pid")
    return found[0]["pid"] if found else None


def process_is_running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, dead but not yet reaped, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@contextlib.contextmanager
def start_home_assistant(
    tmp_path: Path, token: str, *, modern: bool = False, slow_s: float = 0.0
) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """Run the Home Assistant stand-in on a free port for the length of the
    `with`: yields (url of /api/mcp, its process, its journal). It requires
    `Authorization: Bearer <token>`. `modern` also serves 2026-07-28 (the real
    one, on the 1.x SDK, speaks only the handshake). Stopped on exit:
    SIGTERM, then SIGKILL if it has not gone within STOP_LIMIT_S."""
    journal = tmp_path / "home_assistant.journal"
    stderr_path = tmp_path / "home_assistant.stderr"
    argv = [sys.executable, str(HOME_ASSISTANT), "--port", "0", "--journal", str(journal)]
    if modern:
        argv.append("--modern")
    if slow_s:
        argv += ["--slow-s", str(slow_s)]
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                                env={**os.environ, "HA_TOKEN": token})
    try:
        port = _read_port_line(proc, stderr_path, HOME_ASSISTANT_START_LIMIT_S)
        yield f"http://127.0.0.1:{port}{HOME_ASSISTANT_PATH}", proc, journal
    finally:
        stop_process(proc)


def _read_port_line(proc: subprocess.Popen[bytes], stderr_path: Path, limit_s: float) -> int:
    """The port from the server's `PORT <n>` line, waited for at most `limit_s`."""
    assert proc.stdout is not None
    deadline = time.monotonic() + limit_s
    received = b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in received:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"home_assistant.py printed no PORT line within {limit_s} s; "
                                   f"stderr: {stderr_path.read_text(errors='replace')[-2000:]}")
            if not selector.select(timeout=left):
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                proc.wait(timeout=STOP_LIMIT_S)
                raise RuntimeError(f"home_assistant.py exited ({proc.returncode}) before listening; "
                                   f"stderr: {stderr_path.read_text(errors='replace')[-2000:]}")
            received += chunk
    line = received.split(b"\n", 1)[0].decode()
    word, _, number = line.partition(" ")
    if word != "PORT" or not number.isdigit():
        raise RuntimeError(f"home_assistant.py printed {line!r}, not 'PORT <n>'")
    return int(number)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if still there after STOP_LIMIT_S; reaped either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_LIMIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_LIMIT_S)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def server_memory_command() -> list[str] | None:
    """argv for @modelcontextprotocol/server-memory as .ci/run installs it,
    or None where it (or node) is not installed: skip with
    SERVER_MEMORY_INSTALL_HINT. Give it MEMORY_FILE_PATH (server_memory_env),
    or it keeps its graph next to its own code in node_modules."""
    node = shutil.which("node")
    if node is None or not SERVER_MEMORY_ENTRY.is_file():
        return None
    return [node, str(SERVER_MEMORY_ENTRY)]


def server_memory_env(tmp_path: Path) -> dict[str, str]:
    return {"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")}


def time_server_command() -> list[str]:
    """argv for the mcp-server-time console script of the venv running the tests."""
    return [str(Path(sys.executable).parent / "mcp-server-time")]
