"""A minimal stdio MCP server written without the SDK, imitating an old
(1.x-era) server that ignores `notifications/cancelled`: a cancelled
`slow_toggle` is answered anyway once its time is up. A client must drop
that late answer, and must not assume that the cancelled toggle did not
happen. Newline-delimited JSON-RPC on stdin/stdout, standard library only.

    python tests/mcp_servers/late_server.py --journal FILE

It answers `initialize` (2025-11-25), `tools/list` (one tool, `slow_toggle`,
no annotations) and `tools/call`; every other request, `server/discover`
included, gets -32601, so a 2.x client in mode "auto" falls back to the
initialize handshake."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Any

from server_journal import Journal

PROTOCOL_VERSION = "2025-11-25"
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602

SLOW_TOGGLE = {
    "name": "slow_toggle",
    "description": "Toggles something after `seconds`; cannot be stopped once asked.",
    "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}},
}


class LateServer:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._write_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._cancelled_ids: set[Any] = set()
        self._toggles: list[threading.Thread] = []

    def send(self, message: dict[str, Any]) -> None:
        line = json.dumps({"jsonrpc": "2.0", **message}) + "\n"
        with self._write_lock:
            sys.stdout.write(line)
            sys.stdout.flush()

    def answer(self, request_id: Any, result: dict[str, Any]) -> None:
        self.send({"id": request_id, "result": result})

    def refuse(self, request_id: Any, code: int, message: str) -> None:
        self.send({"id": request_id, "error": {"code": code, "message": message}})

    def handle(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        params = message.get("params") or {}
        if "id" not in message:
            self.handle_notification(method, params)
            return
        request_id = message["id"]
        if method == "initialize":
            self.journal.log("initialize", requestedVersion=params.get("protocolVersion"))
            self.answer(request_id, {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "late-server", "version": "1.0.0"},
            })
        elif method == "tools/list":
            self.answer(request_id, {"tools": [SLOW_TOGGLE]})
        elif method == "tools/call":
            self.start_toggle(request_id, params)
        else:
            self.journal.log("method_not_found", method=method, requestId=request_id)
            self.refuse(request_id, METHOD_NOT_FOUND, f"Method not found: {method}")

    def handle_notification(self, method: str | None, params: dict[str, Any]) -> None:
        if method == "notifications/cancelled":
            request_id = params.get("requestId")
            self.journal.log("cancel_received", requestId=request_id, reason=params.get("reason"))
            with self._state_lock:
                self._cancelled_ids.add(request_id)
        # notifications/initialized and anything else: nothing to do.

    def start_toggle(self, request_id: Any, params: dict[str, Any]) -> None:
        name = params.get("name")
        arguments = params.get("arguments") or {}
        if name != "slow_toggle":
            self.refuse(request_id, INVALID_PARAMS, f"Unknown tool: {name}")
            return
        seconds = float(arguments.get("seconds", 0))
        self.journal.log("start", tool="slow_toggle", requestId=request_id, seconds=seconds)
        toggle = threading.Thread(
            target=self.finish_toggle, args=(request_id, seconds), name=f"toggle-{request_id}", daemon=True
        )
        self._toggles.append(toggle)
        toggle.start()

    def finish_toggle(self, request_id: Any, seconds: float) -> None:
        threading.Event().wait(seconds)
        with self._state_lock:
            was_cancelled = request_id in self._cancelled_ids
        # Answered whether cancelled or not: that is the point of this server.
        self.journal.log("answered_after_cancel" if was_cancelled else "done", tool="slow_toggle", requestId=request_id)
        try:
            self.answer(request_id, {"content": [{"type": "text", "text": "toggled"}], "isError": False})
        except BrokenPipeError:
            self.journal.log("stdout_closed", requestId=request_id)

    def serve(self) -> None:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                self.journal.log("unparseable", line=line[:200])
                continue
            self.handle(message)
        self.journal.log("stdin_closed")
        # Toggles already asked for still happen (and are answered if the
        # pipe is still open), as a real device would finish them.
        for toggle in self._toggles:
            toggle.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--journal", required=True, help="file to append one JSON line per event to")
    args = parser.parse_args()
    journal = Journal(args.journal)
    journal.log("pid", pid=os.getpid())
    try:
        LateServer(journal).serve()
    except BrokenPipeError:
        journal.log("stdout_closed")


if __name__ == "__main__":
    main()
