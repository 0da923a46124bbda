"""Every line an editor sends is answered or ignored as JSON-RPC 2.0 says,
and none can end `voice acp`.

`agent-client-protocol` 0.12.1 reads stdin itself, and its reader is not
safe against what a client may send: a line that is a JSON array, string or
number raises in its message handler (the agent exited 1), `null` reads as
the end of input (exit 0), and a line that is not JSON is logged and
dropped with no answer. So the bridge hands the library a reader of its
own (`guard_lines`), fed only with lines that are JSON-RPC objects, and
answers the rest itself on the same writer: -32700 (parse error) for a line
that is not JSON, -32600 (invalid request) for JSON that is not a request,
a notification or a response. JSON-RPC says such errors carry `id: null`
unless the request's id can be read. A batch (an array) is refused whole
with one -32600: ACP defines no batches.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from voice.service.control import nesting_depth

log = logging.getLogger("voice.acp")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
MAX_NESTING = 64  # ACP's deepest message is far shallower


def parsed(line: bytes) -> dict[str, Any] | None:
    """The line's JSON-RPC object, or None when it is not one (`checked` says why)."""
    if checked(line) is not None:
        return None
    message = json.loads(line)
    return message if isinstance(message, dict) else None


def checked(line: bytes) -> dict[str, Any] | None:
    """None when `line` may go on to the library; else the error response to send."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return _error(None, PARSE_ERROR, "Parse error", "the line is not UTF-8 text")
    if nesting_depth(text) > MAX_NESTING:  # deeper would exhaust a parser's recursion (this one's or the library's)
        return _error(None, INVALID_REQUEST, "Invalid Request", f"nested deeper than {MAX_NESTING} levels")
    try:
        message = json.loads(text)
    except ValueError as exc:
        return _error(None, PARSE_ERROR, "Parse error", f"the line is not JSON: {exc}")
    if not isinstance(message, dict):
        what = "a batch (ACP has none)" if isinstance(message, list) else {
            str: "a string", int: "a number", float: "a number", bool: "true or false"}.get(type(message), "null")
        return _error(None, INVALID_REQUEST, "Invalid Request", f"a JSON-RPC message is an object, not {what}")
    msg_id = message.get("id")
    usable_id = msg_id if isinstance(msg_id, (str, int)) and not isinstance(msg_id, bool) else None
    if message.get("jsonrpc") != "2.0":
        return _error(usable_id, INVALID_REQUEST, "Invalid Request", 'a JSON-RPC 2.0 message has "jsonrpc": "2.0"')
    if "method" in message:
        if not isinstance(message["method"], str):
            return _error(usable_id, INVALID_REQUEST, "Invalid Request", '"method" must be a string')
        if "id" in message and usable_id is None and msg_id is not None:
            return _error(None, INVALID_REQUEST, "Invalid Request", '"id" must be a string, a number or null')
        if "params" in message and not isinstance(message["params"], (dict, list)):
            return _error(usable_id, INVALID_REQUEST, "Invalid Request", '"params" must be an object or an array')
        return None
    if "id" in message and ("result" in message or "error" in message):
        return None  # a response to one of our requests (session/request_permission, fs/read_text_file)
    return _error(usable_id, INVALID_REQUEST, "Invalid Request",
                  'neither a request ("method") nor a response ("result" or "error")')


def _error(msg_id: Any, code: int, message: str, details: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message, "data": {"details": details}}}


class LineGuard:
    """`reader` is what the library reads: only JSON-RPC objects from
    `source`; `run()` (in the bridge's task group) answers every other line
    on `writer`, until `source` ends (then `reader` ends too).

    Protocol-level notifications (`$/...`), which the library does not
    route, stop here: `$/cancel_request` for a running `session/prompt`
    cancels its session's turn (`cancel_session`), as session/cancel does;
    others are ignored, as JSON-RPC allows."""

    def __init__(self, source: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int,
                 cancel_session: Callable[[str], Awaitable[None]] | None = None):
        self.source, self.writer = source, writer
        self.reader = asyncio.StreamReader(limit=limit)
        self.cancel_session = cancel_session
        self._prompts: dict[Any, str] = {}  # request id of a session/prompt -> its session (the newest few)

    async def run(self) -> None:
        try:
            while line := await self._next_line():
                if not line.strip():
                    continue
                error = checked(line)
                if error is None:
                    message = parsed(line) or {}
                    method = message.get("method")
                    if isinstance(method, str) and method.startswith("$/") and "id" not in message:
                        await self._protocol_level(method, message.get("params"))
                        continue
                    if method == "session/prompt" and isinstance(message.get("params"), dict):
                        self._prompts[message.get("id")] = message["params"].get("sessionId")
                        while len(self._prompts) > 64:
                            del self._prompts[next(iter(self._prompts))]
                    self.reader.feed_data(line if line.endswith(b"\n") else line + b"\n")
                    continue
                log.warning("acp: answered a line that is not a JSON-RPC message: %s",
                            error["error"]["data"]["details"])
                self.writer.write((json.dumps(error, separators=(",", ":")) + "\n").encode())
                await self.writer.drain()
        finally:
            self.reader.feed_eof()

    async def _protocol_level(self, method: str, params: Any) -> None:
        if method != "$/cancel_request" or self.cancel_session is None or not isinstance(params, dict):
            return
        session = self._prompts.get(params.get("requestId"))
        if isinstance(session, str):
            await self.cancel_session(session)

    async def _next_line(self) -> bytes:
        """The next line, however long (b"" at the end of input)."""
        line = b""
        while True:
            try:
                return line + await self.source.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                return line + exc.partial  # the last line, without its newline
            except asyncio.LimitOverrunError as exc:  # longer than the buffer: take what is there, read on
                line += await self.source.readexactly(exc.consumed)
