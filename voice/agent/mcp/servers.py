"""MCP servers as tool sources: each one's connection, for the life of the app.

One task per server (`McpServer.run`, in the app's task group; the
servers together are voice.agent.mcp.all_servers.McpServers) holds its
`mcp.Client`: the official SDK runs the session and, when a call's wait is
cancelled (a barge-in, a stop, the tool's timeout), sends
`notifications/cancelled` for it (stdio and 2025-11-25 Streamable HTTP), or
ends its request stream (2026-07-28 Streamable HTTP). The call's task does
not wait for the server to agree: cancellation is advisory, so a write that
was sent and cancelled is *unknown* (voice.agent.mcp.tools).

Lifecycle:
- all enabled servers start together when the app opens, each within its
  `start_timeout_s` (the handshake and the tool list); one that does not
  start is reported in one line and the assistant goes on without its
  tools (they are not added later: the request's prefix stays the same);
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
import math
import os
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpx2
import mcp_types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from voice.agent.mcp.settings import ServerSpec
from voice.agent.mcp.stdio import StdioProcess, stdio_transport
from voice.agent.mcp.tools import mcp_tool
from voice.agent.tools.base import Tool, ToolContext, ToolError

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
        self._connect_refusals = 0  # HTTP requests refused at the connection (never sent)
        self._starting = False  # a start was asked for and has not settled
        if not self.spec.enabled:
            self.state = "disabled"

    # -- what the assistant sees ------------------------------------------------

    def tools(self) -> list[Tool]:
        """The offered tools (allow / deny), in name order, once it has listed them."""
        return [mcp_tool(self, t) for t in sorted(self.listed, key=lambda t: t.name) if self.spec.offers(t.name)]

    def fix(self) -> str:
        """What the person can do about a server that is not running."""
        if self.spec.given_by == "editor":
            what = self.spec.url and display_url(self.spec.url) or " ".join([self.spec.command, *self.spec.args])
            return f"check the MCP server {self.spec.name!r} in the editor's settings ({what})"
        if self.state == "disabled":
            return f"set mcp.servers.{self.spec.name}.enabled = true to use it"
        if self.spec.transport == "http":
            _, missing = self.spec.header_values(self.environ)
            if missing:
                return f"set the environment variable {missing[0]} (mcp.servers.{self.spec.name}.headers names it)"
            return f"check that {display_url(self.spec.url)} is an MCP endpoint that answers, and its token"
        return (f"run {' '.join([self.spec.command, *self.spec.args])} by hand to see why; the server gets only "
                f"the variables of tools.command_env and mcp.servers.{self.spec.name}.env")

    # -- a call ---------------------------------------------------------------

    async def call(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> mcp_types.CallToolResult:
        """Send `tools/call` and wait for its result. Raises ToolError when the
        server cannot be reached before anything is sent; the SDK's errors
        after it was sent."""
        client = await self._connected()
        entry = (tool, ctx)
        self._sending.append(entry)
        refused_before = self._connect_refusals
        try:
            # No SDK read timeout: the tool's timeout is the loop's (a cancel), so it too sends notifications/cancelled.
            return await client.call_tool(tool, args)
        except MCPError as exc:
            if exc.code == mcp_types.CONNECTION_CLOSED:
                self._broken.set()
                never_sent = (entry in self._sending if self.spec.transport == "stdio"
                              else self._connect_refusals > refused_before)
                if never_sent:  # the pipe refused it, or the server refused the connection
                    raise ToolError(f"the MCP server {self.spec.name!r} could not be reached ({self._gone_reason()}); "
                                    "nothing was sent") from None
            raise
        finally:
            if entry in self._sending:
                self._sending.remove(entry)

    def unavailable(self) -> str | None:
        """Why a call cannot be sent now (before anyone is asked about it)."""
        if not self.spec.enabled:
            return f"the MCP server {self.spec.name!r} is disabled"
        wait = self._retry_at - anyio.current_time()
        if self._client is None and wait > 0:
            return (f"the MCP server {self.spec.name!r} {self.state} ({self.error}); it is started again in "
                    f"{math.ceil(wait)} s; nothing was sent")
        return None

    async def _connected(self) -> Client:
        if self._client is not None and not self._broken.is_set():
            return self._client
        why_not = self.unavailable()
        if why_not:
            raise ToolError(why_not)
        await self.start()
        if self._client is None:
            raise ToolError(f"the MCP server {self.spec.name!r} could not be started ({self.error}); nothing was sent")
        return self._client

    async def start(self) -> None:
        """Ask the server's task to connect and wait until it is running or
        has failed (its task bounds that by `start_timeout_s`)."""
        if self._client is not None and not self._broken.is_set():
            return
        if not self._starting:  # a start under way is waited for, not begun again
            self._starting, self._settled = True, anyio.Event()
            self._wanted.set()
        await self._settled.wait()

    # -- its task ---------------------------------------------------------------

    async def run(self) -> None:
        """Connect whenever asked (`start`), until cancelled with the app."""
        while True:
            await self._wanted.wait()
            self._wanted = anyio.Event()
            self._broken = anyio.Event()
            connected = False
            # The handshake and the listing within start_timeout_s; no bound once it runs.
            starting = anyio.CancelScope(deadline=anyio.current_time() + self.spec.start_timeout_s)
            try:
                with starting:
                    async with self._open() as client:
                        self.listed = await _list_all(client)
                        starting.deadline = math.inf
                        self.protocol = client.protocol_version
                        self._client, self.state, self.error, connected = client, "running", "", True
                        self._backoff = BACKOFF_START_S
                        self._starting = False
                        self._settled.set()
                        await self._broken.wait()
                        if self.spec.transport == "stdio":  # a closed pipe comes just before the exit status
                            with anyio.move_on_after(1.0):
                                await self.process.exited.wait()
                        raise ServerGone(self._gone_reason())
                if starting.cancelled_caught:
                    self.error = f"it did not answer within {self.spec.start_timeout_s:g} s" + (
                        f" (raise mcp.servers.{self.spec.name}.start_timeout_s if it is slow to start)"
                        if self.spec.given_by == "config" else "")
            except Exception as exc:  # a server's failure is reported, never the assistant's end
                self.error = _describe(exc, self)
            finally:
                self._client = None
            self.state = "crashed" if connected else "failed"
            self._retry_at = anyio.current_time() + self._backoff
            self._backoff = min(BACKOFF_MAX_S, self._backoff * 2)
            self._starting = False
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

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_exit)
                async with Client(transport) as client:
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
                                          event_hooks={"response": [note_refusal]},
                                          transport=_CountingRefusals(self)) as http:
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


class _CountingRefusals(httpx2.AsyncHTTPTransport):
    """Counts the requests the server refused at the connection: those were never sent."""

    def __init__(self, server: McpServer):
        super().__init__()
        self.server = server

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            return await super().handle_async_request(request)
        except httpx2.ConnectError:
            self.server._connect_refusals += 1
            raise


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
    """One line for a failure to start or a connection that ended. Never a
    header value, an `env` value or a URL's credentials or query."""
    return _redact(_first_cause(exc, server), server)


def _first_cause(exc: BaseException, server: McpServer) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    spec = server.spec
    if isinstance(exc, (ServerGone, ToolError)):
        return str(exc)
    if server.process.error:
        return server.process.error
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)) and spec.cwd and not os.path.isdir(spec.cwd):
        return f"its cwd {spec.cwd!r} is not a directory"
    if isinstance(exc, FileNotFoundError):
        return f"{spec.command!r} was not found (on the PATH of tools.command_env)"
    if isinstance(exc, PermissionError):
        what = "is a directory" if os.path.isdir(spec.command) else "cannot be run (permission denied)"
        return f"{spec.command!r} {what}"
    if isinstance(exc, TimeoutError):
        return f"it did not answer within {spec.start_timeout_s:g} s"
    if server.http_refused is not None:
        status = server.http_refused
        names = " or ".join(v for _, v in spec.headers)
        why = f" (its token, from {names}, was refused)" if status in (401, 403) and names else ""
        return f"{display_url(spec.url)} answered HTTP {status}{why}"
    if isinstance(exc, (UnicodeEncodeError, httpx2.LocalProtocolError)):
        names = " or ".join(v for _, v in spec.headers) or "the header values"
        return f"a header value cannot be sent (check {names}: one line, no line breaks, ASCII only)"
    if isinstance(exc, httpx2.HTTPError):
        return f"{display_url(spec.url)} cannot be reached ({type(exc).__name__})"
    code = server.process.returncode
    if code is not None and spec.transport == "stdio":
        tail = server.process.stderr_tail.decode("utf-8", "replace").strip().splitlines()
        return f"it exited with status {code}" + (f": {tail[-1][:200]}" if tail else "")
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def display_url(url: str) -> str:
    """A URL as it may be shown: no user, password or query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _redact(text: str, server: McpServer) -> str:
    secrets = [v for _, v in server.spec.given_headers] + [v for _, v in server.spec.env]
    secrets += list(server.spec.header_values(server.environ)[0].values())
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text.replace(server.spec.url, display_url(server.spec.url)) if server.spec.url else text
