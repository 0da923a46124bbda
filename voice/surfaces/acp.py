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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import anyio

from voice.agent.surface import Delivered, UnitRef, hold_newest

log = logging.getLogger("voice.acp")

SEND_BOUND_S = 5.0  # a client that stops reading stdout for this long loses the piece
# What a send raises when the client has gone (its pipe closed, the connection
# torn down). Anything else is a bug, and is not turned into "not delivered".
CLIENT_GONE = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)


@dataclass
class _Unit:
    text_chars: int = 0
    reasoning_chars: int = 0
    closed: bool = False
    stopped: bool = False


@dataclass
class AcpSurface:
    conn: Any  # acp AgentSideConnection (anything with `session_update(session_id=, update=)`)
    session_id: str
    show_reasoning: bool = True
    tracks_playback: bool = False
    _units: dict[UnitRef, _Unit] = field(default_factory=dict)
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

    def open(self, ref: UnitRef) -> None:
        self._units[ref] = _Unit()
        hold_newest(self._units)

    async def text(self, ref: UnitRef, text: str) -> None:
        from acp import update_agent_message_text

        unit = self._units[ref]
        if not text or unit.stopped:
            return
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

    def delivered(self, ref: UnitRef) -> Delivered:
        unit = self._units.get(ref, _Unit())
        return Delivered(unit.text_chars, unit.reasoning_chars, complete=unit.closed)

    async def wait_delivered(self, ref: UnitRef) -> Delivered:
        return self.delivered(ref)  # every piece was sent before text() returned

    async def stop(self) -> None:
        for unit in self._units.values():
            unit.stopped = True

    async def notice(self, text: str) -> None:
        from acp import update_agent_message_text

        await self.update(update_agent_message_text(f"\n[{text}]\n"))
