"""`voice acp`: the assistant as an Agent Client Protocol agent on stdio.

One ACP session is one conversation in the log (`session/new` starts a new
one; the session id is the conversation id) with its own AgentLoop and
AcpSurface. `session/prompt` runs one turn (source "acp"); `session/cancel`
cancels it like a barge-in, so the log records as delivered exactly the
`agent_message_chunk` text the client was sent.

What an editor gets (ACP v1):
- `loadSession`: `session/load` tells a conversation of the log again as
  `session/update`s (voice.service.acp_history) before it answers, then
  takes prompts; `session/list` lists the log's conversations. An id the
  log does not have is "resource not found" (-32002).
- The session's `mcpServers` (stdio, and http: `mcpCapabilities.http`) are
  started for it with the effects, cancellation and lifecycle of
  `[mcp.servers]` (voice.agent.mcp) and closed with it; one that does not
  start is said to the client in the session (at the end of `session/load`,
  or before the next reply).
- Calls that ask first (a destructive write, by `approve = "destructive"`)
  ask through `session/request_permission`; tool calls go pending,
  in_progress, then completed or failed (voice.surfaces.acp). A permission
  answered `cancelled` stops the turn like `session/cancel` (whichever of the
  two is handled first).
- `promptCapabilities.embeddedContext`: embedded text resources keep their
  URI; a `resource_link` to a file is read through the client's
  `fs/read_text_file` when it offers it, cut to a share of the context
  budget, and the words the model saw are what the log records. Images and
  audio are refused with an error naming why (the model route is text).
- Announcements (a timer) go to the session of the conversation that set
  them; a session not open in this process finds them in the log when it is
  loaded.
- Stop reasons: `end_turn`, `cancelled`, `max_tokens` (the model's finish
  reason "length"), `refusal` ("content_filter"), `max_turn_requests` (the
  turn used all of `llm.max_steps`).
- Every line on stdin is answered or ignored as JSON-RPC says
  (voice.service.acp_lines): no line ends the agent.

Ordering: every update of a turn is written before the prompt's response
(sends are awaited, then the surface is drained), so a client sees all
chunks of a cancelled turn before `stopReason: "cancelled"`.

stdout carries the protocol and nothing else: the protocol gets its own
copy of file descriptor 1, and fd 1 / sys.stdout then point at stderr.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import unquote, urlparse

import anyio
import anyio.abc

from voice.agent.loop import AgentLoop
from voice.agent.mcp.all_servers import McpServers
from voice.agent.tools.base import ToolRegistry
from voice.app import App, mcp_servers
from voice.errors import UsageError
from voice.log import events as ev
from voice.service.acp_mcp import editor_servers, run_session_servers
from voice.service.signals import cancel_on_signal
from voice.settings import Settings
from voice.surfaces.acp import AcpSurface, tool_title

log = logging.getLogger("voice.acp")

_STOP_REASONS = {ev.COMPLETED: "end_turn", ev.ABORTED: "cancelled", ev.INTERRUPTED: "cancelled"}
_FINISH_REASONS = {"length": "max_tokens", "content_filter": "refusal"}
FILE_SHARE = 0.5  # of the conversation's token budget, the most attached files may take
CHARS_PER_TOKEN = 3  # the estimate's rate (voice.log.window.estimate_tokens)

#: ACP sessions held in memory, the most recently used (an editor opens a
#: session per chat and never closes one: over weeks, thousands).
KEEP_SESSIONS = 16
KNOWN_SESSIONS = 4096  # sessions opened in this process that are remembered (ids, cwd, servers) when let go


class PromptRefused(Exception):
    """A prompt block this agent cannot take; the message says why."""


@dataclass
class _Session:
    surface: AcpSurface
    agent: AgentLoop
    servers: McpServers
    scope: anyio.CancelScope | None = None  # its MCP servers run in it
    pending: list[str] = field(default_factory=list)  # said to the client before the next reply
    prompting: anyio.CancelScope | None = None  # a prompt is being answered (its files read, then its turn)

    def close(self) -> None:
        if self.scope is not None:
            self.scope.cancel()


class VoiceAcpAgent:
    """The acp.Agent: initialize, session/new, session/load, session/list,
    session/prompt, session/cancel. Methods it does not define answer
    "method not found".

    A session is a conversation in the log. Only the `KEEP_SESSIONS` most
    recently used are held in memory (their surface, agent loop and MCP
    servers); a prompt to an older one builds them again from its id (and
    the servers the client gave it): the log holds all the conversation
    has, so nothing is lost by letting them go."""

    def __init__(self, app: App, task_group: anyio.abc.TaskGroup):
        self.app = app
        self.tg = task_group
        self.conn: Any = None
        self.sessions: dict[str, _Session] = {}
        self.servers_given: dict[str, list[Any]] = {}  # the client's mcpServers of each session, to rebuild it
        self.cwds: dict[str, str] = {}
        self.known: dict[str, None] = {}  # sessions this process opened, held or not (the newest KNOWN_SESSIONS)
        self.read_files = False  # the client offers fs/read_text_file
        self.active: str | None = None  # where an announcement of no conversation goes
        self.unrouted: list[str] = []  # said before any session existed: told to the next one

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None,
                         **kwargs: Any):
        from acp import PROTOCOL_VERSION, InitializeResponse
        from acp.schema import (AgentCapabilities, Implementation, McpCapabilities, PromptCapabilities,
                                SessionCapabilities, SessionListCapabilities)

        import voice

        fs = getattr(client_capabilities, "fs", None)
        self.read_files = bool(getattr(fs, "read_text_file", False))
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(
                load_session=True, mcp_capabilities=McpCapabilities(http=True, sse=False),
                prompt_capabilities=PromptCapabilities(embedded_context=True, image=False, audio=False),
                session_capabilities=SessionCapabilities(list=SessionListCapabilities())),
            agent_info=Implementation(name="voice", title="voice", version=voice.__version__),
        )

    # -- sessions --------------------------------------------------------------

    async def new_session(self, cwd: str, additional_directories: list[str] | None = None,
                          mcp_servers: list[Any] | None = None, **kwargs: Any):
        from acp import NewSessionResponse

        from voice.log.store import new_conversation_id

        _absolute(cwd)
        conversation = new_conversation_id()
        self._remember(conversation, cwd, mcp_servers)
        await self._hold(conversation)
        self.active = conversation
        return NewSessionResponse(session_id=conversation)

    async def load_session(self, cwd: str, session_id: str, mcp_servers: list[Any] | None = None,
                           additional_directories: list[str] | None = None, **kwargs: Any):
        from acp import RequestError
        from acp.schema import LoadSessionResponse

        from voice.service.acp_history import history_updates

        if not self._session(session_id):
            raise unknown_session(session_id)
        _absolute(cwd)
        held = self.sessions.get(session_id)
        if held is not None and held.prompting is not None:  # refused before anything of it is touched
            raise RequestError.invalid_request({"details": "a prompt is running in this session"})
        self._remember(session_id, cwd, mcp_servers)
        if held is not None:
            self.sessions.pop(session_id).close()  # the client's servers now are the ones it gave here
        session = await self._hold(session_id)
        titles = {n: tool_title(n, session.agent.tools.get(n)) for n in session.agent.tools.names()}
        for update in history_updates(self.app.store, session_id, titles):
            await session.surface.update(update)
        await self._say_pending(session)
        await session.surface.drain()
        self.active = session_id
        return LoadSessionResponse()

    async def list_sessions(self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any):
        from acp.schema import ListSessionsResponse, SessionInfo

        from voice.log.conversations import list_conversations

        cwds = {e.conversation: e.body.cwd for e in self.app.store.events(None, types={ev.ACP_SESSION})}
        infos = []
        for c in reversed(list_conversations(self.app.store)):  # the newest first
            where = cwds.get(c.conversation)
            if c.turns == 0 or where is None or (cwd is not None and where != cwd):
                continue  # only the editor's own threads (those of the asked directory)
            updated = datetime.fromtimestamp(c.last_wall, timezone.utc).isoformat() if c.last_wall else None
            infos.append(SessionInfo(session_id=c.conversation, cwd=where,
                                     title=(c.first_words or c.conversation)[:80], updated_at=updated))
        return ListSessionsResponse(sessions=infos)

    def _remember(self, conversation: str, cwd: str, mcp_servers: list[Any] | None) -> None:
        self.servers_given[conversation] = list(mcp_servers or [])
        self.cwds[conversation] = cwd
        self.known[conversation] = None
        while len(self.known) > KNOWN_SESSIONS:
            old = next(iter(self.known))
            del self.known[old]
            self.servers_given.pop(old, None)
            self.cwds.pop(old, None)
        self.app.store.record(conversation, ev.AcpSession(cwd=cwd))

    def _in_log(self, session_id: str) -> bool:
        return session_id.startswith("c-") and self.app.store.first_turn(session_id) is not None

    async def _hold(self, conversation: str) -> _Session:
        """The session's surface, agent and MCP servers, built for it, newest
        last; the least recently used idle ones beyond KEEP_SESSIONS are let
        go (their servers closed)."""
        session = self.sessions.pop(conversation, None)
        if session is None:
            session = await self._build(conversation)
        self.sessions[conversation] = session
        spare = [c for c, s in self.sessions.items() if c != conversation and s.prompting is None]
        for old in spare[: max(0, len(self.sessions) - KEEP_SESSIONS)]:
            self.sessions.pop(old).close()
        return session

    async def _build(self, conversation: str) -> _Session:
        surface = AcpSurface(self.conn, conversation, show_reasoning=self.app.settings.chat.show_reasoning)
        specs, refused = editor_servers(self.servers_given.get(conversation, []), taken={s.spec.name for s in
                                                                                  self.app.mcp.servers})
        servers = mcp_servers(specs, self.app.store, self.app.tool_env.command_env)
        session = _Session(surface, self.app.agent(surface, conversation), servers, pending=self.unrouted + refused)
        surface.cancel_turn = session.agent.cancel
        self.unrouted = []
        if servers.servers:
            session.scope = await self.tg.start(run_session_servers, servers)
            for server in servers.failed():
                session.pending.append(f"the MCP server {server.spec.name!r} did not start: {server.error}; its "
                                       f"tools are not offered (fix: {server.fix()})")
        tools = ToolRegistry([self.app.tools.get(n) for n in self.app.tools.names()])
        for tool in servers.tools():
            tools.add(tool)
        session.agent.tools = tools
        return session

    def _session(self, session_id: str) -> bool:
        return session_id in self.sessions or session_id in self.known or self._in_log(session_id)

    # -- prompts ---------------------------------------------------------------

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any):
        from acp import PromptResponse, RequestError

        if not self._session(session_id):
            raise unknown_session(session_id)
        session = await self._hold(session_id)
        if session.prompting is not None:
            raise RequestError.invalid_request({"details": "a prompt is already running in this session"})
        session.prompting = anyio.CancelScope()
        try:
            with session.prompting:  # a session/cancel while its files are read: no turn runs
                try:
                    text = await self._prompt_text(session, prompt)
                except PromptRefused as exc:
                    raise RequestError.invalid_params({"details": str(exc)}) from None
            if session.prompting.cancel_called:
                return PromptResponse(stop_reason="cancelled")
            if not text.strip():
                raise RequestError.invalid_params({"details": "the prompt holds no text"})
            self.active = session_id
            await self._say_pending(session)
            result = await session.agent.run_turn(text, source="acp")
            await session.surface.drain()  # every update of the turn precedes the response
        finally:
            session.prompting = None
        if result.outcome == ev.ERROR:
            raise RequestError.internal_error({"details": "the language model request failed", "turn": result.turn})
        return PromptResponse(stop_reason=self._stop_reason(session_id, result.turn, result.outcome))

    def _stop_reason(self, conversation: str, turn: int, outcome: str) -> str:
        if outcome != ev.COMPLETED:
            return _STOP_REASONS[outcome]
        events = self.app.store.events(conversation, turn=turn, types={ev.ASSISTANT_STREAM, ev.STEP_END})
        ends = [e.body for e in events if e.type == ev.ASSISTANT_STREAM and e.body.frame == "end"]
        finish = ends[-1].finish_reason if ends else None
        if finish in _FINISH_REASONS:
            return _FINISH_REASONS[finish]
        steps = [e.body.outcome for e in events if e.type == ev.STEP_END]
        if len(steps) >= self.app.loop_settings.max_steps and steps[-1] == "tool_calls":
            return "max_turn_requests"
        return "end_turn"

    async def _prompt_text(self, session: _Session, blocks: list[Any]) -> str:
        """The words the model sees: text; embedded text resources with their
        URI; linked files read through the client (within FILE_SHARE of the
        budget); other links by their URI."""
        budget = int((self.app.loop_settings.context_tokens - self.app.loop_settings.reply_tokens) * FILE_SHARE
                     * CHARS_PER_TOKEN)
        parts = []
        for b in blocks:
            kind = getattr(b, "type", None)
            if kind == "text":
                parts.append(b.text)
            elif kind in ("image", "audio"):
                raise PromptRefused(f"this agent cannot take {kind} content: its language model route takes text "
                                    "only (promptCapabilities says so); send the words, or a text file")
            elif kind == "resource":
                text = getattr(b.resource, "text", None)
                if text is None:
                    raise PromptRefused(f"the embedded resource {b.resource.uri} is binary: only text resources "
                                        "can be read")
                shown, budget = _within(text, budget)
                parts.append(f"[resource {b.resource.uri}]\n{shown}")
            elif kind == "resource_link":
                shown, budget = await self._linked(session, b, budget)
                parts.append(shown)
        return "\n".join(p for p in parts if p)

    async def _linked(self, session: _Session, link: Any, budget: int) -> tuple[str, int]:
        uri = link.uri
        parsed = urlparse(uri)
        local = parsed.netloc in ("", "localhost")
        if parsed.scheme != "file" or not self.read_files or not local:
            why = ("not a file" if parsed.scheme != "file" else "a file on another host" if not local
                   else "the client does not offer fs/read_text_file")
            return f"[linked {uri} ({why}: not read)]", budget
        path = unquote(parsed.path)
        if not os.path.isabs(path):  # fs/read_text_file takes absolute paths: relative to the session's cwd
            path = os.path.normpath(os.path.join(self.cwds.get(session.surface.session_id, "/"), path))
        try:
            with anyio.fail_after(10):
                response = await self.conn.read_text_file(session_id=session.surface.session_id, path=path)
        except Exception as exc:  # the client's error (no such file, refused): the model is told, the turn goes on
            return f"[file {path}: could not be read: {exc}]", budget
        shown, budget = _within(response.content, budget)
        return f"[file {path}]\n{shown}", budget

    async def _say_pending(self, session: _Session) -> None:
        while session.pending:
            await session.surface.notice(session.pending.pop(0))

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        session = self.sessions.get(session_id)
        if session is not None:
            if session.prompting is not None and not session.agent.busy:
                session.prompting.cancel()  # still reading its files: the turn never starts
            session.agent.cancel()

    async def announce(self, conversation: str, text: str) -> None:
        """To the session of `conversation` (none given: the active one); a
        session not open here finds it in the log when loaded."""
        session = self.sessions.get(conversation or self.active or "")
        if session is not None:
            await session.surface.notice(text)
        elif not conversation:  # the agent's own (an MCP server that did not start): the next session hears it
            self.unrouted.append(text)
            del self.unrouted[:-16]
        else:
            print(f"voice acp: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()


def _absolute(cwd: str) -> None:
    from acp import RequestError

    if not isinstance(cwd, str) or not os.path.isabs(cwd):
        raise RequestError.invalid_params({"cwd": cwd, "details": "cwd must be an absolute path (ACP)"})


def unknown_session(session_id: str):
    """The error for a session id neither held nor in the log (ACP: resource not found)."""
    from acp import RequestError

    return RequestError(-32002, "Resource not found",
                        {"sessionId": session_id, "details": "no such session: not one the log holds"})


def _within(text: str, budget: int) -> tuple[str, int]:
    """`text` cut to what is left of `budget` (characters), saying so."""
    if len(text) <= budget:
        return text, budget - len(text)
    return (text[:max(0, budget)] + f"\n[cut: {len(text)} characters, only the first {max(0, budget)} fit the "
            "context]"), 0


async def _protocol_streams():
    """(reader, writer) on stdin / a private copy of stdout; afterwards fd 1
    and sys.stdout point at stderr, so nothing else can write to the protocol."""
    from acp import stdio_streams
    from acp.core import DEFAULT_STDIO_BUFFER_LIMIT_BYTES

    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = proto  # stdio_streams reads sys.stdout
    try:
        return await stdio_streams(limit=DEFAULT_STDIO_BUFFER_LIMIT_BYTES)
    except ValueError as exc:  # asyncio takes pipes, sockets and terminals, not regular files
        raise UsageError(f"voice acp talks ACP on stdin/stdout, which must be pipes (run it from an ACP client): "
                         f"{exc}") from None
    finally:
        sys.stdout = sys.stderr


def run_acp(settings: Settings, db: str | None, llm_spec: str | None) -> int:
    """Serve ACP on stdin/stdout until end of input (or SIGINT/SIGTERM)."""
    import acp
    from acp.core import DEFAULT_STDIO_BUFFER_LIMIT_BYTES

    from voice.app import open_app
    from voice.service.acp_lines import LineGuard

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="voice acp: %(levelname)s %(message)s")

    async def main() -> None:
        async with open_app(settings, db=db, llm=llm_spec, notice=lambda text: print(text, file=sys.stderr, flush=True)) as app:
            reader, writer = await _protocol_streams()
            async with anyio.create_task_group() as tg:
                bridge = VoiceAcpAgent(app, tg)
                guard = LineGuard(reader, writer, DEFAULT_STDIO_BUFFER_LIMIT_BYTES, cancel_session=bridge.cancel)
                await app.announcer.attach_routed(bridge.announce)

                tg.start_soon(cancel_on_signal, tg.cancel_scope)
                tg.start_soon(guard.run)
                try:
                    await acp.run_agent(bridge, writer, guard.reader)  # returns at end of input
                finally:
                    bridge.close()
                tg.cancel_scope.cancel()

    anyio.run(main)
    return 0
