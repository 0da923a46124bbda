"""The control socket: JSON lines over a Unix socket (mode 0600) under
$XDG_RUNTIME_DIR/voice/.

Requests are objects with a "cmd": status, say {"text"}, cancel, mute,
unmute, history, events {"after"?, "follow"?}. Each gets one reply line
({"ok": true, ...} or {"ok": false, "error": ...}); `events` then sends the
log's events after "after" (default: from now) as lines, and with "follow"
(the default) keeps streaming new ones until the client goes away; with
"follow": false it closes the connection once it has sent them. A malformed request gets an
error reply and touches nothing else; a client that misbehaves only ever
ends its own connection.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import ByteStream, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

from voice.errors import Failed, UsageError
from voice.log.projections import derive_messages

MAX_LINE = 64 * 1024
COMMANDS = ("status", "say", "cancel", "mute", "unmute", "history", "events")


def socket_path(config: dict[str, Any]) -> Path:
    if config["service"]["socket"]:
        return Path(config["service"]["socket"])
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/voice-{os.getuid()}"
    return Path(runtime) / "voice" / "control.sock"


class ControlServer:
    def __init__(self, session, config: dict[str, Any]):
        self.session = session
        self.path = socket_path(config)

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.path.exists():
            try:
                probe = await anyio.connect_unix(self.path)
            except OSError:
                self.path.unlink()  # stale, from a daemon that died
            else:
                await probe.aclose()
                raise UsageError(f"another voice daemon is listening on {self.path}: stop it first "
                                 "(systemctl --user stop voice)")
        old_umask = os.umask(0o177)  # the socket is created 0600, never briefly wider
        try:
            listener = await anyio.create_unix_listener(self.path)
        finally:
            os.umask(old_umask)
        task_status.started()
        try:
            async with listener:
                await listener.serve(self._client)
        finally:
            self.path.unlink(missing_ok=True)

    async def _client(self, stream: ByteStream) -> None:
        reader = BufferedByteReceiveStream(stream)
        async with stream:
            while True:
                try:
                    line = await reader.receive_until(b"\n", MAX_LINE)
                except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                except anyio.DelimiterNotFound:
                    await self._send(stream, {"ok": False, "error": f"request longer than {MAX_LINE} bytes"})
                    return
                try:
                    request = json.loads(line)
                    if not isinstance(request, dict) or not isinstance(request.get("cmd"), str):
                        raise ValueError('a request is a JSON object with a "cmd" string')
                except ValueError as exc:
                    await self._send(stream, {"ok": False, "error": f"malformed request: {exc}"})
                    continue
                if request["cmd"] == "events":
                    await self._events(stream, request)
                    return
                await self._send(stream, await self.handle(request))

    @staticmethod
    async def _send(stream: ByteStream, reply: dict[str, Any]) -> None:
        await stream.send(json.dumps(reply, ensure_ascii=False).encode() + b"\n")

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        s = self.session
        cmd = request["cmd"]
        if cmd == "status":
            route = s.provider.route
            return {"ok": True, "state": s.state(), "turn": s.agent.current_turn, "conversation": s.conversation,
                    "device": s.device.describe(), "stt": s.stt.name, "tts": "piper en_US-joe-medium",
                    "llm": {"provider": route.provider, "model": route.model, "base_url": route.base_url},
                    "muted": s.listen.muted,
                    "listen": {"mode": s.listen.gate.mode if s.listen.gate else "open",
                               "state": s.listen.gate.state(s.listen.position / 16000) if s.listen.gate else "open",
                               "wake_word": s.wake_word}}
        if cmd == "say":
            text = request.get("text")
            if not isinstance(text, str) or not text.strip():
                return {"ok": False, "error": 'say needs {"text": "..."}'}
            result = await s.submit_text(text.strip())
            from voice.log.projections import turn_reply

            reply = turn_reply(s.store, s.conversation, result.turn)
            return {"ok": True, "turn": result.turn, "outcome": result.outcome, "reply": reply.delivered_text}
        if cmd == "cancel":
            return {"ok": True, "cancelled": await s.interrupt()}
        if cmd in ("mute", "unmute"):
            s.listen.muted = cmd == "mute"
            return {"ok": True, "muted": s.listen.muted}
        if cmd == "history":
            return {"ok": True, "conversation": s.conversation, "messages": derive_messages(s.store, s.conversation)}
        return {"ok": False, "error": f"unknown command {cmd!r}; known: {', '.join(COMMANDS)}"}

    async def _events(self, stream: ByteStream, request: dict[str, Any]) -> None:
        after = request.get("after")
        after = after if isinstance(after, int) else self.session.store.last_seq()
        follow = request.get("follow", True) is not False
        await self._send(stream, {"ok": True, "streaming": "events", "after": after, "follow": follow})
        try:
            while True:
                for event in self.session.store.events(after_seq=after):
                    await self._send(stream, event.to_json())
                    after = event.seq
                if not follow:
                    return
                await anyio.sleep(0.1)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return  # the client left


async def request(path: Path, payload: dict[str, Any], show: Callable[[dict[str, Any]], None], *,
                  stream: bool = False) -> dict[str, Any]:
    """The client side (`voice ctl`): send one request and hand each reply
    line to `show` (for a stream, every line until the daemon ends it).
    Returns the first reply. A daemon that is not there is a UsageError (how
    to start one); one that goes away before it answers, or that answers
    with something that is not JSON, is `Failed`."""
    try:
        conn = await anyio.connect_unix(path)
    except OSError as exc:
        raise UsageError(f"no voice daemon answers on {path} ({exc.strerror or exc}): start it with "
                         "`voice run` or `systemctl --user start voice`") from None
    gone = (f"the voice daemon on {path} closed the connection before it answered (it stopped or restarted; "
            "`systemctl --user status voice` or its terminal says why)")
    first: dict[str, Any] | None = None
    async with conn:
        reader = BufferedByteReceiveStream(conn)
        try:
            await conn.send(json.dumps(payload).encode() + b"\n")
            while True:
                line = await reader.receive_until(b"\n", 16 * MAX_LINE)
                try:
                    reply = json.loads(line)
                except ValueError:
                    raise Failed(f"the voice daemon on {path} sent a line that is not JSON: {line[:80]!r}") from None
                first = reply if first is None else first
                show(reply)
                if not stream:
                    return first
        except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError,
                OSError):
            if first is None:
                raise Failed(gone) from None
            if payload.get("follow"):
                raise Failed(f"the voice daemon on {path} went away; the event stream ended") from None
            return first
