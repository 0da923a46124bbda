"""A stdio MCP server (the SDK's MCPServer) that misbehaves on request, for
tests of the MCP client: a slow write that can be cancelled, a write during
which the server dies, an answer too big to read, a tool error, and tools
whose annotations say read-only, idempotent or destructive. Every call is
written to a journal (--journal FILE), synced line by line, so a test sees
what the server saw even when it died.

    python tests/mcp_servers/chaos_server.py --journal FILE [--ignore-sigterm] [--crash-on-start]

--ignore-sigterm: SIGTERM is ignored and the process stays alive after its
stdin closes, so only SIGKILL ends it (a server that will not stop).
--crash-on-start: one line on stderr, exit status 2, before any MCP."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import TypedDict

import anyio
from mcp.server import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from server_journal import Journal

CRASH_EXIT_STATUS = 3
CRASH_ON_START_STATUS = 2
DEVICE_OFFLINE = "the device is offline"


class LookupResult(TypedDict):
    key: str
    value: int


def build_server(journal: Journal) -> MCPServer:
    server = MCPServer("chaos", log_level="WARNING")

    @server.tool(structured_output=False)
    async def slow_write(seconds: float, label: str) -> str:
        """Write after `seconds`; no annotations, so a client must assume it has effects."""
        journal.log("start", tool="slow_write", label=label)
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            journal.log("cancelled", tool="slow_write", label=label)
            raise
        journal.log("done", tool="slow_write", label=label)
        return f"wrote {label}"

    @server.tool(structured_output=False)
    def crash_write(label: str) -> str:
        """Starts a write, then the server process dies before answering."""
        journal.log("start", tool="crash_write", label=label)
        os._exit(CRASH_EXIT_STATUS)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True), structured_output=False)
    def huge_read(chars: int) -> str:
        """Returns `chars` characters."""
        journal.log("start", tool="huge_read", label=str(chars))
        journal.log("done", tool="huge_read", label=str(chars))
        return "x" * chars

    @server.tool(
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False),
        structured_output=True,
    )
    def lookup(key: str) -> LookupResult:
        """Looks a key up; structured output (the SDK declares an outputSchema)."""
        journal.log("start", tool="lookup", label=key)
        journal.log("done", tool="lookup", label=key)
        return {"key": key, "value": len(key)}

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, read_only_hint=False), structured_output=False)
    def unlock_door(door: str) -> str:
        """Unlocks a door (destructive)."""
        journal.log("start", tool="unlock_door", label=door)
        journal.log("done", tool="unlock_door", label=door)
        return f"unlocked {door}"

    @server.tool(
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True),
        structured_output=False,
    )
    def turn_on_light(name: str) -> str:
        """Turns a light on (idempotent, not destructive)."""
        journal.log("start", tool="turn_on_light", label=name)
        journal.log("done", tool="turn_on_light", label=name)
        return f"{name} is on"

    @server.tool()
    def fail_write(label: str) -> CallToolResult:
        """Always fails as a tool error (isError true)."""
        journal.log("start", tool="fail_write", label=label)
        journal.log("failed", tool="fail_write", label=label)
        # Returned, not raised: a raised ToolError reaches the client as
        # "Error executing tool fail_write: ...", and the test wants the
        # device's own words.
        return CallToolResult(content=[TextContent(type="text", text=DEVICE_OFFLINE)], is_error=True)

    return server


def keep_process_alive() -> None:
    """A non-daemon thread that never ends: the interpreter waits for it at
    exit, so the process outlives its stdin closing."""
    threading.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--journal", required=True, help="file to append one JSON line per event to")
    parser.add_argument("--ignore-sigterm", action="store_true", help="ignore SIGTERM and stdin EOF")
    parser.add_argument("--crash-on-start", action="store_true", help="exit 2 before speaking MCP")
    args = parser.parse_args()

    if args.crash_on_start:
        print("chaos_server: crashing on start as asked (--crash-on-start)", file=sys.stderr, flush=True)
        sys.exit(CRASH_ON_START_STATUS)

    journal = Journal(args.journal)
    journal.log("pid", pid=os.getpid())
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        threading.Thread(target=keep_process_alive, name="keep-alive", daemon=False).start()
        journal.log("ignoring_sigterm")

    build_server(journal).run("stdio")
    journal.log("stdin_closed")


if __name__ == "__main__":
    main()
