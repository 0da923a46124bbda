"""`voice acp`: the assistant as an Agent Client Protocol agent on stdio.

One ACP session is one conversation in the log (`session/new` starts a new
one; the session id is the conversation id) with its own AgentLoop and
AcpSurface. `session/prompt` runs one turn (source "acp"); `session/cancel`
cancels it like a barge-in, so the log records as delivered exactly the
`agent_message_chunk` text the client was sent. Tool calls the loop runs are
reported as `tool_call` / `tool_call_update` by wrapping each tool.

Ordering: every update of a turn is written before the prompt's response
(sends are awaited, then the surface is drained), so a client sees all
chunks of a cancelled turn before `stopReason: "cancelled"`.

stdout carries the protocol and nothing else: the protocol gets its own
copy of file descriptor 1, and fd 1 / sys.stdout then point at stderr.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

import anyio

from voice.agent.loop import AgentLoop
from voice.app import App
from voice.agent.tools import ToolRegistry
from voice.agent.tools.base import Tool, ToolContext, ToolOutcome
from voice.errors import UsageError
from voice.log import events as ev
from voice.surfaces.acp import AcpSurface

log = logging.getLogger("voice.acp")

_STOP_REASONS = {ev.COMPLETED: "end_turn", ev.ABORTED: "cancelled", ev.INTERRUPTED: "cancelled"}


def prompt_text(blocks: list[Any]) -> str:
    """The words of a prompt: text blocks, linked resources by URI, embedded
    text resources by their text. Images and audio are not supported."""
    parts = []
    for b in blocks:
        kind = getattr(b, "type", None)
        if kind == "text":
            parts.append(b.text)
        elif kind == "resource_link":
            parts.append(b.uri)
        elif kind == "resource" and getattr(b.resource, "text", None):
            parts.append(b.resource.text)
    return "\n".join(p for p in parts if p)


def _reported(tool: Tool, surface: AcpSurface) -> Tool:
    """`tool` whose runs are reported to the client: `tool_call` before,
    `tool_call_update` (completed/failed) after."""
    from acp import start_tool_call, text_block, tool_content, update_tool_call

    kind = "execute" if tool.name == "run_command" else ("read" if tool.effect == "read" else "other")

    async def run(args: dict[str, Any], ctx: ToolContext) -> Any:
        call_id = ctx.tool_call_id
        await surface.update(start_tool_call(call_id, tool.name, kind=kind, status="in_progress", raw_input=args))
        try:
            out = await tool.run(args, ctx)
        except BaseException as exc:  # an error, a timeout or the turn's cancel: the call did not complete
            await surface.update(update_tool_call(call_id, status="failed",
                                                  raw_output={"error": str(exc) or type(exc).__name__}))
            raise
        outcome = out if isinstance(out, ToolOutcome) else ToolOutcome(out)
        failed = outcome.receipt is not None and outcome.receipt.state == ev.FAILED
        shown = outcome.content if isinstance(outcome.content, str) else json.dumps(outcome.content, ensure_ascii=False)
        await surface.update(update_tool_call(call_id, status="failed" if failed else "completed",
                                              raw_output=outcome.content, content=[tool_content(text_block(shown))]))
        return out

    return dataclasses.replace(tool, run=run)


def reported_tools(tools: ToolRegistry, surface: AcpSurface) -> ToolRegistry:
    return ToolRegistry([_reported(tools.get(name), surface) for name in tools.names()])


@dataclass
class _Session:
    surface: AcpSurface
    agent: AgentLoop


#: ACP sessions held in memory, the most recently used (an editor opens a
#: session per chat and never closes one: over weeks, thousands).
KEEP_SESSIONS = 16


class VoiceAcpAgent:
    """The acp.Agent: initialize, session/new, session/prompt, session/cancel.
    Methods it does not define answer "method not found".

    A session is a conversation in the log. Only the `KEEP_SESSIONS` most
    recently used are held in memory (their surface and agent loop); a
    prompt to an older one builds them again from its id: the log holds
    all the conversation has, so nothing is lost by letting them go. (A
    session never prompted has nothing in the log yet: it stays held.)"""

    def __init__(self, app: App):
        self.app = app
        self.conn: Any = None
        self.sessions: dict[str, _Session] = {}
        self.active: str | None = None  # the session timers announce to

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None,
                         **kwargs: Any):
        from acp import PROTOCOL_VERSION, InitializeResponse
        from acp.schema import AgentCapabilities, Implementation, PromptCapabilities

        import voice

        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(load_session=False, prompt_capabilities=PromptCapabilities()),
            agent_info=Implementation(name="voice", title="voice", version=voice.__version__),
        )

    async def new_session(self, cwd: str, additional_directories: list[str] | None = None,
                          mcp_servers: list[Any] | None = None, **kwargs: Any):
        from acp import NewSessionResponse

        from voice.log.store import new_conversation_id

        if mcp_servers:
            log.warning("acp: MCP servers are not supported; ignoring %d", len(mcp_servers))
        conversation = new_conversation_id()
        self._hold(conversation)
        self.active = conversation
        return NewSessionResponse(session_id=conversation)

    def _hold(self, conversation: str) -> _Session:
        """The session's surface and agent, built for it, newest last; the
        least recently used idle ones beyond KEEP_SESSIONS are let go."""
        session = self.sessions.pop(conversation, None)
        if session is None:
            surface = AcpSurface(self.conn, conversation, show_reasoning=self.app.config["chat"]["show_reasoning"])
            session = _Session(surface, self.app.agent(surface, conversation, reported_tools(self.app.tools, surface)))
        self.sessions[conversation] = session
        # Let go of the least recently used that the log can rebuild (idle, with a turn).
        spare = [c for c, s in self.sessions.items() if c != conversation and not s.agent.busy
                 and self.app.store.first_turn(c) is not None]
        for old in spare[: max(0, len(self.sessions) - KEEP_SESSIONS)]:
            del self.sessions[old]
        return session

    def _session(self, session_id: str) -> _Session | None:
        """A held session, or one let go that the log still has."""
        if session_id in self.sessions:
            return self._hold(session_id)
        if session_id.startswith("c-") and self.app.store.first_turn(session_id) is not None:
            return self._hold(session_id)
        return None

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any):
        from acp import PromptResponse, RequestError

        session = self._session(session_id)
        if session is None:
            raise RequestError.invalid_params({"sessionId": session_id, "details": "no such session"})
        if session.agent.busy:
            raise RequestError.invalid_request({"details": "a prompt is already running in this session"})
        text = prompt_text(prompt)
        if not text.strip():
            raise RequestError.invalid_params({"details": "the prompt holds no text"})
        self.active = session_id
        result = await session.agent.run_turn(text, source="acp")
        await session.surface.drain()  # every update of the turn precedes the response
        if result.outcome == ev.ERROR:
            raise RequestError.internal_error({"details": "the language model request failed", "turn": result.turn})
        return PromptResponse(stop_reason=_STOP_REASONS[result.outcome])

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        session = self.sessions.get(session_id)
        if session is not None:
            session.agent.cancel()

    async def announce(self, text: str) -> None:
        session = self.sessions.get(self.active or "")
        if session is None:
            print(f"voice acp: {text}", file=sys.stderr, flush=True)
        else:
            await session.surface.notice(text)


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


def run_acp(config: dict[str, Any], db: str | None, llm_spec: str | None) -> int:
    """Serve ACP on stdin/stdout until end of input (or SIGINT/SIGTERM)."""
    import acp

    from voice.app import open_app

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="voice acp: %(levelname)s %(message)s")

    async def main() -> None:
        async with open_app(config, db=db, llm=llm_spec, notice=lambda text: print(text, file=sys.stderr, flush=True)) as app:
            bridge = VoiceAcpAgent(app)
            await app.announcer.attach(bridge.announce)
            reader, writer = await _protocol_streams()
            async with anyio.create_task_group() as tg:

                async def on_signal() -> None:
                    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                        async for _ in signals:
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(on_signal)
                await acp.run_agent(bridge, writer, reader)  # returns at end of input
                tg.cancel_scope.cancel()

    anyio.run(main)
    return 0
