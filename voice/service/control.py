"""The control socket: JSON lines over a Unix socket (mode 0600) in a
private directory: $XDG_RUNTIME_DIR/voice/, or without XDG_RUNTIME_DIR,
$XDG_STATE_HOME/voice/run/ (in the user's home, never a shared /tmp path
that another user could create first). A directory that exists with another
owner, as a symlink, or writable by others is refused, not used.

Requests are objects with a "cmd": status, say {"text"}, cancel, mute,
unmute, history {"list"?}, new, save {"dir": an absolute path}, events {"after"?, "follow"?},
approve {"always"?} and deny (the question a call is waiting on: voice.agent.approvals). Each gets one reply line
({"ok": true, ...} or {"ok": false, "error": ...}); `events` then sends the
log's events after "after" (default: from now) as lines, and with "follow"
(the default) keeps streaming new ones until the client goes away; with
"follow": false it closes the connection once it has sent them.

No client can take the daemon down: whatever happens on one connection
(a client gone before its reply, a request that is not JSON, nested too
deep, an integer SQLite cannot hold, text that is not valid Unicode, a bug)
ends at most that connection. A malformed request gets an error reply and
touches nothing else. Lines are at most MAX_LINE bytes, nesting at most
MAX_DEPTH, integers 64-bit; at most MAX_CONNECTIONS connections are served
at once (one more is told so and closed), and a connection that sends no
request for IDLE_S seconds, or does not read its replies for SEND_S, is
closed.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any, Protocol

import anyio
from anyio.abc import ByteStream, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

from voice.agent.turn_state import TurnResult
from voice.errors import Failed, UsageError
from voice.log import events as ev
from voice.log.feed import follow as follow_log
from voice.log.projections import turn_reply
from voice.log.conversations import NewConversation, ended, list_conversations
from voice.log.store import EventStore

MAX_LINE = 64 * 1024
MAX_DEPTH = 32
MAX_CONNECTIONS = 64
IDLE_S = 60.0
SEND_S = 10.0
_MAX_INT = 2**63 - 1  # what SQLite holds
_SOCKET_PATH_MAX = 107  # sun_path, less its NUL
COMMANDS = ("status", "say", "cancel", "mute", "unmute", "history", "new", "save", "events", "approve", "deny")


def checked_socket_path(path: Path) -> Path:
    """The socket path (voice.settings: ServiceSettings.socket_path), once
    its directory is known to be private and the path fits in a Unix socket
    address; UsageError naming the fix if not."""
    if len(os.fsencode(path)) > _SOCKET_PATH_MAX:
        raise UsageError(f"the control socket path {path} is longer than {_SOCKET_PATH_MAX} bytes: "
                         "set [service] socket to a shorter one")
    private_socket_dir(path.parent)
    return path


def private_socket_dir(directory: Path) -> None:
    """Create the socket's directory 0700, or check that an existing one is
    ours and that nobody else can write in it (where a socket could be
    swapped for another). One line naming the problem and the fix if not."""
    try:
        directory.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UsageError(f"cannot create the control socket's directory {directory}: {exc.strerror or exc}") from None
    st = directory.lstat()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"the control socket's directory {directory} is not a directory (a symlink or a file): "
                         "remove it, or set [service] socket")
    if st.st_uid != os.getuid():
        raise UsageError(f"the control socket's directory {directory} belongs to uid {st.st_uid}, not to you "
                         f"(uid {os.getuid()}): remove it, or set [service] socket")
    if st.st_mode & 0o022:
        raise UsageError(f"the control socket's directory {directory} is writable by others "
                         f"(mode {stat.S_IMODE(st.st_mode):o}): chmod 700 {directory}")


class MalformedRequest(ValueError):
    """A request line the daemon does not act on."""


def _bounded_int(text: str) -> int:
    value = int(text)
    if abs(value) > _MAX_INT:
        raise MalformedRequest(f"integer {text[:20]}{'…' if len(text) > 20 else ''} is out of range (64-bit)")
    return value


def _refuse_constant(name: str) -> Any:
    raise MalformedRequest(f"{name} is not a JSON number")


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def nesting_depth(text: str) -> int:
    """How deep arrays and objects nest in JSON `text`, counted without
    parsing it (deep nesting exhausts a parser's recursion)."""
    depth = deepest = 0
    for ch in re.sub(r"[^\[\]{}]", "", _STRING.sub("", text)):
        depth += 1 if ch in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def parse_request(line: bytes) -> dict[str, Any]:
    """One request line -> its object; MalformedRequest saying why not.
    Depth is checked before parsing (deep nesting would exhaust the parser's
    recursion), and every string must be valid Unicode (a lone surrogate
    cannot be written to the log)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedRequest(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if nesting_depth(text) > MAX_DEPTH:
        raise MalformedRequest(f"nested deeper than {MAX_DEPTH} levels")
    try:
        request = json.loads(text, parse_int=_bounded_int, parse_constant=_refuse_constant)
    except MalformedRequest:
        raise
    except ValueError as exc:
        raise MalformedRequest(str(exc)) from None
    if not isinstance(request, dict) or not isinstance(request.get("cmd"), str):
        raise MalformedRequest('a request is a JSON object with a "cmd" string')
    try:
        json.dumps(request, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise MalformedRequest("text is not valid Unicode (a lone surrogate)") from None
    return request


class Assistant(Protocol):
    """What the control socket may ask of the running assistant (the voice
    session implements it); nothing else of its insides is reached."""

    store: EventStore

    @property
    def conversation(self) -> str: ...

    def status(self) -> dict[str, Any]: ...

    async def say(self, text: str) -> TurnResult | NewConversation:
        """A typed turn, answered like a spoken one (text that only asks for a
        new conversation runs no turn: what it did). Raises
        anyio.ClosedResourceError/BrokenResourceError when shutting down."""

    async def cancel(self) -> bool: ...

    def mute(self, muted: bool) -> bool: ...

    def history(self) -> list[dict[str, Any]]: ...

    async def new_conversation(self) -> str:
        """End the conversation (after a running turn); the id of the next one."""

    def answer_approval(self, granted: bool, always: bool) -> str | None:
        """Answer the question a call waits on; its text, or None when none waits."""


# Writes what the session kept (voice.service.recording) into a new directory;
# ValueError with one line for a directory it cannot use or nothing kept.
Save = Callable[[Path], dict[str, Any]]


def _cannot_save(directory: Path) -> dict[str, Any]:
    raise ValueError("this assistant keeps no recording")


class ControlServer:
    def __init__(self, assistant: Assistant, path: Path, save: Save = _cannot_save):
        self.assistant = assistant
        self.save = save
        self.path = path  # (ServiceSettings.socket_path)
        self.connections = 0

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        checked_socket_path(self.path)
        if self.path.is_symlink() or self.path.exists():
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
            async with listener, anyio.create_task_group() as tg:
                while True:
                    try:
                        stream = await listener.accept()
                    except anyio.BrokenResourceError as exc:
                        cause = exc.__cause__
                        if isinstance(cause, OSError) and cause.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS,
                                                                          errno.ENOMEM, errno.ECONNABORTED):
                            await anyio.sleep(0.1)  # out of descriptors for now: the next accept may work
                            continue
                        raise
                    if self.connections >= MAX_CONNECTIONS:
                        tg.start_soon(self._refuse, stream)
                    else:
                        self.connections += 1
                        tg.start_soon(self._client, stream)
        finally:
            self.path.unlink(missing_ok=True)

    async def _refuse(self, stream: ByteStream) -> None:
        async with stream:
            with anyio.move_on_after(1.0):
                try:
                    await self._send(stream, {"ok": False, "error": f"too many connections ({MAX_CONNECTIONS} are "
                                                                    "open): try again when one has closed"})
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass

    async def _client(self, stream: ByteStream) -> None:
        """One connection. Invariant: nothing raised here reaches the
        listener; a cancellation (shutdown) still propagates."""
        try:
            async with stream:
                await self._converse(stream)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, TimeoutError, OSError):
            pass  # the client went away or stopped reading
        except Exception as exc:  # a bug must cost this connection, not the daemon: say it and go on
            print(f"voice: control connection closed after an error: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
        finally:
            self.connections -= 1

    async def _converse(self, stream: ByteStream) -> None:
        reader = BufferedByteReceiveStream(stream)
        while True:
            try:
                with anyio.fail_after(IDLE_S):
                    line = await reader.receive_until(b"\n", MAX_LINE)
            except (anyio.IncompleteRead, anyio.EndOfStream):
                return
            except TimeoutError:
                await self._send(stream, {"ok": False, "error": f"no request for {IDLE_S:.0f} s: closing"})
                return
            except anyio.DelimiterNotFound:
                await self._send(stream, {"ok": False, "error": f"request longer than {MAX_LINE} bytes"})
                return
            try:
                request = parse_request(line)
            except MalformedRequest as exc:
                await self._send(stream, {"ok": False, "error": f"malformed request: {exc}"})
                continue
            if request["cmd"] == "events":
                await self._events(stream, request)
                return
            await self._send(stream, await self.handle(request))

    @staticmethod
    async def _send(stream: ByteStream, reply: dict[str, Any]) -> None:
        with anyio.fail_after(SEND_S):  # a client that does not read gives up its connection
            await stream.send(json.dumps(reply, ensure_ascii=False).encode() + b"\n")

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        a = self.assistant
        cmd = request["cmd"]
        if cmd == "status":
            return {"ok": True, **a.status()}
        if cmd == "say":
            text = request.get("text")
            if not isinstance(text, str) or not text.strip():
                return {"ok": False, "error": 'say needs {"text": "..."}'}
            try:
                result = await a.say(text.strip())
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return {"ok": False, "error": "the assistant is shutting down; the turn did not run"}
            if isinstance(result, NewConversation):  # the text only asked for a new conversation: no turn
                return _switched(a.store, result.before, result.after)
            reply = turn_reply(a.store, a.conversation, result.turn)
            answer = {"ok": True, "turn": result.turn, "outcome": result.outcome, "reply": reply.delivered_text}
            if result.outcome == ev.COMPLETED and not reply.delivered_text and reply.generated_text:
                # answered but not heard (the speaker was lost): the person who typed it reads it here
                answer["not_said"] = reply.generated_text
            return answer
        if cmd == "cancel":
            return {"ok": True, "cancelled": await a.cancel()}
        if cmd in ("mute", "unmute"):
            return {"ok": True, "muted": a.mute(cmd == "mute")}
        if cmd == "history" and request.get("list"):
            listed = [c.__dict__ for c in list_conversations(a.store)]
            return {"ok": True, "conversation": a.conversation, "conversations": listed}
        if cmd == "history":
            return {"ok": True, "conversation": a.conversation, "messages": a.history()}
        if cmd == "save":
            directory = request.get("dir")
            if not isinstance(directory, str) or not os.path.isabs(directory):
                return {"ok": False, "error": 'save needs {"dir": "/an/absolute/path"}'}
            try:
                return {"ok": True, **self.save(Path(directory))}
            except (ValueError, OSError) as exc:
                return {"ok": False, "error": str(exc)}
        if cmd in ("approve", "deny"):
            always = request.get("always", False)
            if not isinstance(always, bool) or (always and cmd == "deny"):
                return {"ok": False, "error": '"always" (true/false) goes with approve only'}
            question = a.answer_approval(cmd == "approve", always)
            if question is None:
                return {"ok": False, "error": "no question is waiting for an answer"}
            return {"ok": True, "decision": "granted" if cmd == "approve" else "denied", "question": question,
                    "always": always}
        if cmd == "new":
            before = a.conversation
            try:
                after = await a.new_conversation()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return {"ok": False, "error": "the assistant is shutting down"}
            return _switched(a.store, before, after)
        return {"ok": False, "error": f"unknown command {cmd!r}; known: {', '.join(COMMANDS)}"}

    async def _events(self, stream: ByteStream, request: dict[str, Any]) -> None:
        after = request.get("after")
        if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after < 0):
            await self._send(stream, {"ok": False, "error": '"after" must be a sequence number (0 or more)'})
            return
        after = after if after is not None else self.assistant.store.last_seq()
        follow = request.get("follow", True) is not False
        await self._send(stream, {"ok": True, "streaming": "events", "after": after, "follow": follow})
        store = self.assistant.store
        if not follow:
            for event in store.events(after_seq=after):
                await self._send(stream, event.to_json())
            return
        # Fed in process as each event is committed (no poll of the log); until the
        # client leaves (the send fails) or the daemon stops (the feed ends).
        async with aclosing(follow_log(store, after)) as events:
            async for event in events:
                await self._send(stream, event.to_json())


def _switched(store: EventStore, before: str, after: str) -> dict[str, Any]:
    """The reply to a request that ended the conversation (`new`, or `say` with a new-conversation phrase)."""
    end = ended(store, before) if after != before else None
    return {"ok": True, "conversation": after, "ended": before if after != before else None,
            "reason": end.reason if end else None}


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


async def stream_until_stopped(path: Path, payload: dict[str, Any],
                               show: Callable[[dict[str, Any]], None]) -> dict[str, Any] | None:
    """`request(..., stream=True)` until the daemon ends the stream or this
    process gets SIGINT (Ctrl-C) or SIGTERM; None when stopped so. The signals
    are taken here, not left to Python's KeyboardInterrupt: a process started
    with SIGINT ignored (a script's background job, a test runner that
    ignores it) never raises one, and `voice ctl events --follow` ran on;
    one that inherited them blocked never saw them."""
    import signal

    from voice.service.signals import STOP_SIGNALS, cancel_on_signal

    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS))  # nor inherited blocked
    ended: list[dict[str, Any] | Exception] = []  # the first reply, or why the stream failed (UsageError, Failed)
    async with anyio.create_task_group() as tg:
        async def run() -> None:
            try:
                ended.append(await request(path, payload, show, stream=True))
            except (UsageError, Failed) as exc:  # raised below as it is, not in the task group's exception group
                ended.append(exc)
            tg.cancel_scope.cancel()  # the stream ended: stop watching for signals

        await tg.start(cancel_on_signal, tg.cancel_scope)  # taken before the request is sent
        tg.start_soon(run)
    if ended and isinstance(ended[0], Exception):
        raise ended[0]
    return ended[0] if ended else None
