"""The ACP surface: replies stream to an Agent Client Protocol client as
`session/update` notifications.

Delivered = sent: a piece of text counts as delivered only once its
`agent_message_chunk` notification has been written to the client (the send
is awaited, shielded from the turn's cancellation so that a chunk is never
written yet left uncounted). At any cancellation point the chunks the
client received are therefore exactly the delivered prefix.

Every send goes through `update()`, which also counts sends in flight, so
the bridge can `drain()` before it answers a prompt: all output of a turn
precedes the prompt's response.

Tool calls are shown as the loop reports them (`tool_state`): `tool_call`
pending when the model made it, then in_progress once dispatched, then
completed or failed with `rawOutput` what the model saw of the result. A
call that asks first asks the client (`ask_permission`:
`session/request_permission` with allow/reject once/always).

A reply that broke off (a provider error) cannot be taken back: what the
client was sent stays. The next attempt's first chunk is preceded by a line
saying the reply above broke off, so nothing that follows pretends to
replace what the client can still see.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import anyio

from voice.agent.approvals import DENIED, GRANTED, WITHDRAWN, Answer
from voice.agent.surface import Delivered, ShownUnit, ShowsText, UnitRef

log = logging.getLogger("voice.acp")

SEND_BOUND_S = 5.0  # a client that stops reading stdout for this long loses the piece
BROKE_OFF = "\n\n[the reply above broke off: the language model failed; trying again]\n\n"
# session/request_permission's options (ACP PermissionOptionKind), and what each answers.
PERMISSION_OPTIONS = (("allow_once", "Allow once", GRANTED, False), ("allow_always", "Always allow", GRANTED, True),
                      ("reject_once", "Reject", DENIED, False), ("reject_always", "Always reject", DENIED, True))
# What a send raises when the client has gone (its pipe closed, the connection
# torn down). Anything else is a bug, and is not turned into "not delivered".
CLIENT_GONE = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)


@dataclass
class AcpSurface(ShowsText):
    conn: Any  # acp AgentSideConnection (anything with `session_update(session_id=, update=)`)
    session_id: str
    show_reasoning: bool = True
    tracks_playback: bool = False
    cancel_turn: Callable[[], object] = lambda: None  # the session's: stops its running turn, as session/cancel does
    _units: dict[UnitRef, ShownUnit] = field(default_factory=dict)
    _broke_off: bool = False  # a unit with text sent was discarded: the next text says so first
    _in_flight: int = 0
    _drained: anyio.Event | None = None  # set when the last send in flight ends

    # -- sending -------------------------------------------------------------

    async def update(self, update: Any) -> bool:
        """Send one session/update; True once it was written to the client."""
        self._in_flight += 1
        try:
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(SEND_BOUND_S):
                    await self.conn.session_update(session_id=self.session_id, update=update)
                    return True
            log.warning("acp: a session/update was not written within %.0f s", SEND_BOUND_S)
            return False
        except CLIENT_GONE as exc:  # the client went away: nothing more reaches it
            log.warning("acp: session/update failed: %s", exc)
            return False
        finally:
            self._in_flight -= 1
            if not self._in_flight and self._drained is not None:
                self._drained.set()
                self._drained = None

    async def drain(self, bound_s: float = SEND_BOUND_S) -> None:
        """Wait until no send is in flight (so they precede what comes next)."""
        with anyio.move_on_after(bound_s):
            while self._in_flight:
                if self._drained is None:
                    self._drained = anyio.Event()
                await self._drained.wait()

    # -- the Surface protocol --------------------------------------------------

    async def text(self, ref: UnitRef, text: str) -> None:
        from acp import update_agent_message_text

        unit = self._units[ref]
        if not text or unit.stopped:
            return
        if self._broke_off:
            self._broke_off = False
            await self.update(update_agent_message_text(BROKE_OFF))
        if await self.update(update_agent_message_text(text)):
            unit.text_chars += len(text)

    async def reasoning(self, ref: UnitRef, text: str) -> None:
        from acp import update_agent_thought_text

        unit = self._units[ref]
        if not self.show_reasoning or not text or unit.stopped:
            return
        if await self.update(update_agent_thought_text(text)):
            unit.reasoning_chars += len(text)

    async def close(self, ref: UnitRef) -> None:
        self._units[ref].closed = True

    def discard(self, ref: UnitRef, reason: str) -> None:
        unit = self._units.get(ref)
        if unit is not None:
            unit.stopped = True
            self._broke_off = self._broke_off or unit.text_chars > 0

    async def stop(self) -> None:
        for unit in self._units.values():
            unit.stopped = True

    async def notice(self, text: str) -> None:
        from acp import update_agent_message_text

        await self.update(update_agent_message_text(f"\n[{text}]\n"))

    # -- tool calls and permission ------------------------------------------------

    async def tool_state(self, call: Any, tool: Any, status: str, result: Any = None) -> None:
        """Where a call stands (voice.agent.loop): pending, in_progress,
        completed or failed, with what the model saw of the result."""
        from acp import start_tool_call, text_block, tool_content, update_tool_call

        if status == "pending":
            try:
                args = call.arguments()
            except ValueError:
                args = call.arguments_json
            await self.update(start_tool_call(call.id, tool_title(call.name, tool), kind=tool_kind(tool),
                                              status="pending", raw_input=args))
            return
        if result is None:
            await self.update(update_tool_call(call.id, status=status))
            return
        seen = result.content if result.status == "ok" else {"status": result.status, "error": result.error}
        shown = seen if isinstance(seen, str) else json.dumps(seen, ensure_ascii=False)
        await self.update(update_tool_call(call.id, status=status, raw_output=seen,
                                           content=[tool_content(text_block(shown))]))

    async def ask_permission(self, call: Any, tool: Any, args: dict[str, Any], question: str) -> Answer:
        """session/request_permission for the call; the client's answer. A
        `session/cancel` cancels the turn, and with it this wait (withdrawn)."""
        from acp.schema import AllowedOutcome, PermissionOption, ToolCallUpdate

        options = [PermissionOption(option_id=option, name=name, kind=option)
                   for option, name, _, _ in PERMISSION_OPTIONS]
        shown = ToolCallUpdate(tool_call_id=call.id, title=tool_title(call.name, tool), kind=tool_kind(tool),
                               status="pending", raw_input=args)
        try:
            response = await self.conn.request_permission(session_id=self.session_id, tool_call=shown, options=options)
        except CLIENT_GONE as exc:
            log.warning("acp: session/request_permission failed: %s", exc)
            return Answer(DENIED, "unavailable")
        except Exception as exc:  # the client answered with an error, or with no outcome this agent can read
            log.warning("acp: session/request_permission was answered with no usable outcome: %s", exc)
            return Answer(DENIED, "unavailable", "the editor's answer could not be read")
        outcome = response.outcome
        if isinstance(outcome, AllowedOutcome):
            for option, _, decision, always in PERMISSION_OPTIONS:
                if outcome.option_id == option:
                    return Answer(decision, "acp", option, always)
            return Answer(DENIED, "acp", f"unknown option {outcome.option_id!r}")
        # "cancelled": the client cancelled the prompt turn (ACP: it sends session/cancel, then answers what
        # it had pending so). Its notification may be handled after this response, so the turn is stopped
        # here: the question is withdrawn as stopped, and the model is not asked again as if it was declined.
        self.cancel_turn()
        await anyio.sleep(0)  # the turn's cancel is taken here
        return Answer(WITHDRAWN, "acp", "cancelled")


def tool_title(name: str, tool: Any) -> str:
    """A title a person can read: an MCP tool's own ("Turn off (home)"),
    else its name in words ("Set timer")."""
    title = getattr(tool, "title", "") or ""
    source = getattr(tool, "source", "") or ""
    if title:
        return f"{title} ({source})" if source else title
    words = name.split("__", 1)[-1].replace("_", " ").strip()
    return words[:1].upper() + words[1:]


def tool_kind(tool: Any) -> str:
    if tool is None:
        return "other"
    if tool.name == "run_command":
        return "execute"
    return "read" if tool.effect == "read" else "other"
