"""Helpers for tests that run real MCP servers as processes: where the test
servers in tests/mcp_servers/ are and how to start them, what their journals
say (one JSON line per event, synced as it happens, so what a server saw is
evidence even after it died), a Home Assistant stand-in on a free port, and
the argv of two third-party servers: the npm package
@modelcontextprotocol/server-memory that .ci/run installs into .ci/node/, and
the mcp-server-time console script of this venv; and, for a server's whole
process tree, wrappers to start a server through (a shell script, `npx`,
`uvx`), a real `voice chat` that uses one server's tool, and how to find
every process of that server's tree in /proc."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import shutil
import signal
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


# ------------------------------------------------ a server's whole process tree

# Set in a server's `env`, inherited by everything it starts (its guardian
# included): how a test finds every process of one server's tree in /proc.
TREE_MARKER = "VOICE_TEST_SERVER_TREE"
TIME_SERVER_VERSION = "2026.10.19"  # the test extra's pin (pyproject.toml)
UV_FETCH_LIMIT_S = 300.0

# A launcher as many are: it runs the server as its child and waits for it (no exec).
SHELL_WRAPPER = '#!/bin/sh\n"$@"\nstatus=$?\necho "wrapper: the server exited with $status" >&2\nexit $status\n'
# The same, but the server leaves the wrapper's session and process group (setsid, no exec).
SETSID_WRAPPER = '#!/bin/sh\nsetsid "$@"\nexit $?\n'


def server_tree(marker: str) -> dict[int, str]:
    """pid -> command line of every live process whose environment holds
    TREE_MARKER=marker."""
    needle = f"{TREE_MARKER}={marker}".encode()
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and process_is_running(int(name)):
            found[int(name)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def tree_left_after(marker: str, within_s: float) -> tuple[dict[int, str], float]:
    """(what of the tree is still there after `within_s`, seconds until it was
    gone or the limit), polled every 20 ms: returns as soon as it is gone."""
    started = time.monotonic()
    while (left := server_tree(marker)) and time.monotonic() - started < within_s:
        time.sleep(0.02)
    return left, time.monotonic() - started


def write_wrapper(folder: Path, body: str) -> str:
    path = folder / "wrapper.sh"
    path.write_text(body)
    path.chmod(0o755)
    return str(path)


def stubborn_chaos_behind(folder: Path, launcher: str) -> str:
    """[mcp.servers.srv] for the chaos server behind `launcher`, in the mode that
    outlives its stdin's end and SIGTERM (as a server with work of its own, a
    timer or a subscription, does). Its `env` is MARKER_ENV, for OneToolChat."""
    argv = [launcher, *chaos_server_command(folder / "chaos.journal", ignore_sigterm=True)]
    return (f"[mcp.servers.srv]\ncommand = {json.dumps(argv[0])}\nargs = {json.dumps(argv[1:])}\n"
            "trust_annotations = true\nenv = { MARKER_ENV }\n")


def npx_server_memory(folder: Path) -> str | None:
    """[mcp.servers.srv] for @modelcontextprotocol/server-memory as its README
    starts it (`npx -y`), in .ci/node where .ci/run installs it (npx finds it
    there and fetches nothing); None where it or npx is not installed
    (SERVER_MEMORY_INSTALL_HINT)."""
    if server_memory_command() is None or shutil.which("npx") is None:
        return None
    return (f'[mcp.servers.srv]\ncommand = "npx"\nargs = ["-y", "@modelcontextprotocol/server-memory"]\n'
            f"cwd = {json.dumps(str(SERVER_MEMORY_ENTRY.parents[3]))}\nread_tools = [\"read_graph\"]\n"
            f'env = {{ MARKER_ENV, MEMORY_FILE_PATH = {json.dumps(str(folder / "memory.jsonl"))}, '
            'npm_config_offline = "true", npm_config_update_notifier = "false" }\n')


def venv_path() -> str:
    """PATH with this interpreter's bin first (where pip put uv and uvx)."""
    return f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def warm_uv_cache() -> tuple[str | None, str]:
    """(uv's cache with mcp-server-time==TIME_SERVER_VERSION in it, "") or
    (None, why not). Fetched from PyPI with this process's environment (its
    certificates, its proxy), once: the server then starts offline, and a
    test's bound is not a download's."""
    uv, uvx = shutil.which("uv", path=venv_path()), shutil.which("uvx", path=venv_path())
    if uv is None or uvx is None:
        return None, "uv is not installed: pip install -e '.[test]' (uv is in the test extra)"
    cache = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True, timeout=30).stdout.strip()
    try:
        warm = subprocess.run([uvx, "--python", sys.executable, "--from", f"mcp-server-time=={TIME_SERVER_VERSION}",
                               "mcp-server-time", "--help"], env={**os.environ, "UV_CACHE_DIR": cache},
                              capture_output=True, text=True, timeout=UV_FETCH_LIMIT_S)
    except subprocess.TimeoutExpired:
        return None, f"uvx could not fetch mcp-server-time=={TIME_SERVER_VERSION} within {UV_FETCH_LIMIT_S:g} s"
    if warm.returncode != 0:
        return None, (f"uvx could not fetch mcp-server-time=={TIME_SERVER_VERSION} (it needs PyPI once): "
                      f"{(warm.stderr.strip().splitlines() or [''])[-1]}")
    return cache, ""


def uvx_time_server(cache: str) -> str:
    """[mcp.servers.srv]: the README's lines for mcp-server-time (`uvx`),
    pinned as the test extra pins it; uv told to use `cache` (warm_uv_cache)
    and this interpreter, and to stay offline (with only tools.command_env's
    variables it would not reach PyPI anyway)."""
    return (f'[mcp.servers.srv]\ncommand = "uvx"\nargs = ["mcp-server-time=={TIME_SERVER_VERSION}"]\n'
            "trust_annotations = true\nstart_timeout_s = 60\n"
            f"env = {{ MARKER_ENV, UV_PYTHON = {json.dumps(sys.executable)}, UV_CACHE_DIR = {json.dumps(cache)}, "
            'UV_OFFLINE = "1" }\n')


class OneToolChat:
    """A real `voice chat` (`python -m voice chat`, a scripted model) with one
    MCP server, [mcp.servers.srv] (`server`, a config whose MARKER_ENV becomes
    this chat's TREE_MARKER), whose model calls `tool` once, then says DONE."""

    UP_WITHIN_S = 60.0

    def __init__(self, folder: Path, server: str, tool: str, arguments: dict[str, Any]) -> None:
        self.marker = secrets.token_hex(8)
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / f"voice-{self.marker}.toml"
        config.write_text(server.replace("MARKER_ENV", f'{TREE_MARKER} = "{self.marker}"'))
        script = folder / f"replies-{self.marker}.toml"
        toml_arguments = ", ".join(f"{key} = {json.dumps(value)}" for key, value in arguments.items())
        script.write_text(f'[[reply]]\nchunk_delay_ms = 0\n[[reply.tool_calls]]\nname = "srv__{tool}"\n'
                          f"arguments = {{ {toml_arguments} }}\n"
                          '[[reply]]\nchunk_delay_ms = 0\ntext = "DONE"\n')
        env = {k: v for k, v in os.environ.items() if k != "VOICE_DB"}
        env.update(XDG_STATE_HOME=str(folder / "state"), XDG_CONFIG_HOME=str(folder / "cfg"),
                   XDG_DATA_HOME=str(folder / "data"), HF_HUB_OFFLINE="1", PATH=venv_path())
        self.stderr_path = folder / f"chat-{self.marker}.stderr"
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "voice", "chat", "--config", str(config), "--db",
                 str(folder / f"e-{self.marker}.db"), "--llm", f"scripted:{script}"],
                cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
        self.out = b""

    def ask(self) -> dict[int, str]:
        """One turn that uses the tool; the server's tree once it has answered."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"use the tool\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + self.UP_WITHIN_S
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while b"assistant: DONE" not in self.out:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no answer within {self.UP_WITHIN_S} s: {self.out!r} {self._stderr()}")
                if selector.select(timeout=left):
                    chunk = os.read(self.proc.stdout.fileno(), 65536)
                    if not chunk:
                        raise RuntimeError(f"voice chat ended: {self.out!r} {self._stderr()}")
                    self.out += chunk
        return server_tree(self.marker)

    def end(self) -> int:
        """End of input: the chat exits as a person's does; its status."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=30)

    def close(self) -> None:
        """Whatever happened: voice killed, and no stray left for what runs next."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        for pid in server_tree(self.marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-2000:]
