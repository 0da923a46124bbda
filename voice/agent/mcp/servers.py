"""MCP servers as tool sources: each one's connection, for the life of the app.

One task per server (`McpServer.run`, in the app's task group) holds its
`mcp.Client`: the official SDK runs the session and, when a call's wait is
cancelled (a barge-in, a stop, the tool's timeout), sends
`notifications/cancelled` for it (stdio and 2025-11-25 Streamable HTTP), or
ends its request stream (2026-07-28 Streamable HTTP). The call's task does
not wait for the server to agree: cancellation is advisory, so a write that
was sent and cancelled is *unknown* (voice.agent.mcp.tools).

Lifecycle:
- all enabled servers start together when the app opens, within
  `START_TIMEOUT_S`; one that does not start is reported in one line and
  the assistant goes on without its tools;
- a server that exits (a crash) is restarted on its next use, after a
  back-off that doubles from 1 s up to 60 s; the call it had in flight ends
  unknown, and is never sent again by this program;
- at the app's end each stdio server gets stdin closed, SIGTERM, SIGKILL,
  within 2.5 s (voice.agent.mcp.stdio).

A result that comes for a request we cancelled is logged as `late/output`
(kind `mcp-result`) through `on_late` and has no authority: the SDK has
already dropped its request, and the turn has ended.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import mcp_types
from anyio.abc import TaskStatus
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from voice.agent.mcp.settings import ServerSpec
from voice.agent.mcp.stdio import StdioProcess, stdio_transport
from voice.agent.mcp.tools import mcp_tool
from voice.agent.tools.base import Tool, ToolContext, ToolError

START_TIMEOUT_S = 10.0
BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 60.0
KEEP_CALLS = 256  # request ids remembered, for late results


@dataclass(frozen=True)
class LateResult:
    server: str
    tool: str
    conversation: str
    turn: int
    tool_call_id: str
    error: str | None  # the server's error, when the late answer was one


@dataclass
class WireEvent:
    """A message on a stdio server's wire, for tests and benchmarks."""

    at: float  # anyio.current_time()
    direction: str  # "out" | "in"
    method: str | None
    id: Any


class ServerGone(Exception):
    pass


@dataclass
class McpServer:
    spec: ServerSpec
    command_env: dict[str, str] = field(default_factory=dict)
    environ: Mapping[str, str] = field(default_factory=dict)
    on_late: Callable[[LateResult], None] = lambda late: None
    # Filled as it runs:
    state: str = "not started"  # running | failed (never started) | crashed (exited since) | disabled
    error: str = ""
    listed: list[mcp_types.Tool] = field(default_factory=list)  # as the server listed them, offered or not
    process: StdioProcess = field(default_factory=StdioProcess)
    wire: deque[WireEvent] = field(default_factory=lambda: deque(maxlen=256))
    protocol: str = ""
    http_refused: int | None = None  # the HTTP status of the last refused request

    def __post_init__(self) -> None:
        self._client: Client | None = None
        self._wanted = anyio.Event()
        self._settled = anyio.Event()
        self._broken = anyio.Event()
        self._retry_at = 0.0
        self._backoff = BACKOFF_START_S
        self._calls: OrderedDict[Any, tuple[str, ToolContext]] = OrderedDict()  # request id -> call
        self._cancelled: OrderedDict[Any, float] = OrderedDict()
        self._sending: deque[tuple[str, ToolContext]] = deque()  # calls about to be written, in order
        if not self.spec.enabled:
            self.state = "disabled"

    # -- what the assistant sees ------------------------------------------------

    def tools(self) -> list[Tool]:
        """The offered tools (allow / deny), in name order, once it has listed them."""
        return [mcp_tool(self, t) for t in sorted(self.listed, key=lambda t: t.name) if self.spec.offers(t.name)]

    def fix(self) -> str:
        """What the person can do about a server that is not running."""
        if self.state == "disabled":
            return f"set mcp.servers.{self.spec.name}.enabled = true to use it"
        if self.spec.transport == "http":
            _, missing = self.spec.header_values(self.environ)
            if missing:
                return f"set the environment variable {missing[0]} (mcp.servers.{self.spec.name}.headers names it)"
            return f"check that {self.spec.url} is an MCP endpoint that answers, and its token"
        return (f"run {' '.join([self.spec.command, *self.spec.args])} by hand to see why; the server gets only "
                f"the variables of tools.command_env and mcp.servers.{self.spec.name}.env")

    # -- a call ---------------------------------------------------------------

    async def call(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> mcp_types.CallToolResult:
        """Send `tools/call` and wait for its result. Raises ToolError when the
        server cannot be reached before anything is sent; the SDK's errors
        after it was sent."""
        client = await self._connected()
        self._sending.append((tool, ctx))
        try:
            # No SDK read timeout: the tool's timeout is the loop's (a cancel), so it too sends notifications/cancelled.
            return await client.call_tool(tool, args)
        except MCPError as exc:
            if exc.code == mcp_types.CONNECTION_CLOSED:
                self._broken.set()
            raise
        finally:
            try:
                self._sending.remove((tool, ctx))
            except ValueError:
                pass  # written: `_calls` has it now

    async def _connected(self) -> Client:
        if self._client is not None and not self._broken.is_set():
            return self._client
        if not self.spec.enabled:
            raise ToolError(f"the MCP server {self.spec.name!r} is disabled")
        wait = self._retry_at - anyio.current_time()
        if wait > 0:
            raise ToolError(f"the MCP server {self.spec.name!r} {self.state} ({self.error}); it is started again in "
                            f"{wait:.0f} s; nothing was sent")
        await self.start()
        if self._client is None:
            raise ToolError(f"the MCP server {self.spec.name!r} could not be started ({self.error}); nothing was sent")
        return self._client

    async def start(self, bound_s: float = START_TIMEOUT_S) -> None:
        """Ask the server's task to connect and wait (at most `bound_s`) until
        it is running or has failed."""
        if self._client is not None and not self._broken.is_set():
            return
        self._settled = anyio.Event()
        self._wanted.set()
        with anyio.move_on_after(bound_s):
            await self._settled.wait()
        if self._client is None and not self.error:
            self.error = f"it did not answer within {bound_s:g} s"

    # -- its task ---------------------------------------------------------------

    async def run(self) -> None:
        """Connect whenever asked (`start`), until cancelled with the app."""
        while True:
            await self._wanted.wait()
            self._wanted = anyio.Event()
            self._broken = anyio.Event()
            connected = False
            try:
                async with self._open() as client:
                    with anyio.fail_after(START_TIMEOUT_S):
                        self.listed = await _list_all(client)
                    self.protocol = client.protocol_version
                    self._client, self.state, self.error, connected = client, "running", "", True
                    self._backoff = BACKOFF_START_S
                    self._settled.set()
                    await self._broken.wait()
                    if self.spec.transport == "stdio":  # a closed pipe comes just before the exit status
                        with anyio.move_on_after(1.0):
                            await self.process.exited.wait()
                    raise ServerGone(self._gone_reason())
            except Exception as exc:  # a server's failure is reported, never the assistant's end
                self.error = _describe(exc, self)
            finally:
                self._client = None
            self.state = "crashed" if connected else "failed"
            self._retry_at = anyio.current_time() + self._backoff
            self._backoff = min(BACKOFF_MAX_S, self._backoff * 2)
            self._settled.set()

    def _gone_reason(self) -> str:
        code = self.process.returncode
        if code is None:
            return "the connection closed"
        return f"it exited with status {code}" if code >= 0 else f"it was killed by signal {-code}"

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[Client]:
        spec = self.spec
        if spec.transport == "stdio":
            self.process = StdioProcess()
            env = {**self.command_env, **dict(spec.env)}
            transport = stdio_transport([spec.command, *spec.args], env, spec.cwd or None, self.process, self._seen)

            async def watch_exit() -> None:
                await self.process.exited.wait()
                self._broken.set()

            async with anyio.create_task_group() as tg, Client(transport) as client:
                tg.start_soon(watch_exit)
                yield client
                tg.cancel_scope.cancel()
        else:
            headers, missing = spec.header_values(self.environ)
            if missing:
                raise ToolError(f"the environment variable {missing[0]} is not set")
            self.http_refused = None

            async def note_refusal(response: httpx2.Response) -> None:
                if response.status_code >= 400:  # the SDK reports only "an error response"
                    self.http_refused = response.status_code

            async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0),
                                          event_hooks={"response": [note_refusal]}) as http:
                async with Client(streamable_http_client(spec.url, http_client=http)) as client:
                    yield client

    def _seen(self, direction: str, message: dict[str, Any]) -> None:
        """Every message on a stdio wire: pairs our calls with their request
        ids, so a result after our cancel is known as late."""
        method, msg_id = message.get("method"), message.get("id")
        self.wire.append(WireEvent(anyio.current_time(), direction, method, msg_id))
        if direction == "out" and method == "tools/call" and self._sending:
            self._calls[msg_id] = self._sending.popleft()
            while len(self._calls) > KEEP_CALLS:
                self._calls.popitem(last=False)
        elif direction == "out" and method == "notifications/cancelled":
            self._cancelled[(message.get("params") or {}).get("requestId")] = anyio.current_time()
            while len(self._cancelled) > KEEP_CALLS:
                self._cancelled.popitem(last=False)
        elif direction == "in" and method is None and msg_id is not None:
            call = self._calls.pop(msg_id, None)
            if call is not None and self._cancelled.pop(msg_id, None) is not None:
                tool, ctx = call
                error = message.get("error")
                self.on_late(LateResult(self.spec.name, tool, ctx.conversation, ctx.turn, ctx.tool_call_id,
                                        json.dumps(error) if error else None))


async def _list_all(client: Client) -> list[mcp_types.Tool]:
    tools, cursor = [], None
    for _ in range(100):  # pages
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _describe(exc: BaseException, server: McpServer) -> str:
    """One line for a failure to start or a connection that ended."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, (ServerGone, ToolError)):
        return str(exc)
    if isinstance(exc, FileNotFoundError):
        return f"{server.spec.command!r} was not found (on the PATH of tools.command_env)"
    if isinstance(exc, PermissionError):
        return f"{server.spec.command!r} cannot be run (permission denied)"
    if isinstance(exc, TimeoutError):
        return f"it did not answer within {START_TIMEOUT_S:g} s"
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"{server.spec.url} answered HTTP {exc.response.status_code}"
    if isinstance(exc, httpx2.HTTPError):
        return f"{server.spec.url} cannot be reached ({type(exc).__name__}: {exc})"
    if server.http_refused is not None:
        status = server.http_refused
        names = " or ".join(v for _, v in server.spec.headers)
        why = f" (its token, from {names}, was refused)" if status in (401, 403) and names else ""
        return f"{server.spec.url} answered HTTP {status}{why}"
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    code = server.process.returncode
    if code is not None and server.spec.transport == "stdio":
        tail = server.process.stderr_tail.decode("utf-8", "replace").strip().splitlines()
        text = f"it exited with status {code}" + (f": {tail[-1][:200]}" if tail else "")
    return text


@dataclass
class McpServers:
    """Every configured server; `run` in the app's task group."""

    servers: list[McpServer]

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start every enabled server (together, each within START_TIMEOUT_S),
        report started, then keep their connections until cancelled."""
        async with anyio.create_task_group() as tg:
            for server in self.servers:
                tg.start_soon(server.run)
            async with anyio.create_task_group() as starting:
                for server in self.servers:
                    if server.spec.enabled:
                        starting.start_soon(server.start)
            task_status.started()
            await anyio.sleep_forever()

    def tools(self) -> list[Tool]:
        return [tool for server in self.servers for tool in server.tools()]

    def failed(self) -> list[McpServer]:
        return [s for s in self.servers if s.state in ("failed", "crashed")]
