"""A stand-in for Home Assistant's `mcp_server` integration, for tests of
the MCP client over Streamable HTTP: served at /api/mcp on 127.0.0.1, it
refuses (401) any request without `Authorization: Bearer <HA_TOKEN>`, and
offers tools named like Home Assistant's (HassTurnOn, HassTurnOff,
GetLiveContext) with no annotations at all, as the real one does, so a
client learns nothing from annotations about which call unlocks a door.
Like the real one, HassTurnOff on a lock unlocks it.

    HA_TOKEN=secret python tests/mcp_servers/home_assistant.py --port 0 [--journal FILE] [--modern] [--slow-s S]

--port 0 picks a free port; either way `PORT <n>` is printed on stdout once
the server is listening. The real integration is built on the 1.x SDK and
so speaks only the initialize handshake (2025-11-25): `server/discover` is
refused with -32601 unless --modern, which also serves 2026-07-28. Like the
real one it is stateless and answers each POST with a JSON body.
--slow-s makes HassTurnOn and HassTurnOff take that long before they act (a
slow device), so a test can stop a call mid-flight: each JSON-RPC message
posted is journaled (`posted`, with its method), and so is a handler the
server cancelled (`cancelled`)."""

from __future__ import annotations

import argparse
import functools
import hmac
import json
import os
import socket
import sys
from typing import Any

import anyio
import uvicorn
from mcp.server import MCPServer
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import METHOD_NOT_FOUND
from starlette.types import ASGIApp, Receive, Scope, Send

from server_journal import Journal

MCP_PATH = "/api/mcp"
UNAUTHORIZED_BODY = b"401: Unauthorized"
STARTUP_LIMIT_S = 20.0


class Home:
    """Entity states, changed the way Home Assistant's intents change them."""

    def __init__(self, journal: Journal, slow_s: float = 0.0) -> None:
        self.journal = journal
        self.slow_s = slow_s
        self.entities: dict[str, dict[str, str]] = {
            "Kitchen light": {"domain": "light", "entity_id": "light.kitchen", "state": "off", "area": "Kitchen"},
            "Front door": {"domain": "lock", "entity_id": "lock.front_door", "state": "locked", "area": "Hallway"},
        }

    def find(self, name: str) -> dict[str, str]:
        for entity_name, entity in self.entities.items():
            if entity_name.casefold() == name.strip().casefold():
                return entity
        raise ToolError(f"MatchFailedError: no entity named {name!r}")

    def set_state(self, tool: str, name: str, turned_on: bool) -> str:
        self.journal.log("start", tool=tool, label=name)
        try:
            entity = self.find(name)
        except ToolError as error:
            self.journal.log("failed", tool=tool, label=name, error=str(error))
            raise
        if entity["domain"] == "lock":
            # HassTurnOn locks a lock and HassTurnOff unlocks it (Home Assistant's turn_on/turn_off intents).
            new_state = "locked" if turned_on else "unlocked"
        else:
            new_state = "on" if turned_on else "off"
        old_state, entity["state"] = entity["state"], new_state
        self.journal.log("state", entity=entity["entity_id"], label=name, old=old_state, new=new_state)
        self.journal.log("done", tool=tool, label=name)
        return json.dumps({
            "speech": {},
            "response_type": "action_done",
            "data": {
                "targets": [],
                "success": [{"name": name, "type": "entity", "id": entity["entity_id"]}],
                "failed": [],
            },
        })

    def live_context(self) -> str:
        self.journal.log("start", tool="GetLiveContext", label="")
        lines = ["Live Context: An overview of the areas and the devices in this smart home:"]
        for name, entity in self.entities.items():
            lines += [
                f"- names: {name}",
                f"  domain: {entity['domain']}",
                f"  state: '{entity['state']}'",
                f"  areas: {entity['area']}",
            ]
        self.journal.log("done", tool="GetLiveContext", label="")
        return json.dumps({"success": True, "result": "\n".join(lines)})


def build_server(home: Home, *, modern: bool) -> MCPServer:
    server = MCPServer("home-assistant", version="2026.10.0", log_level="WARNING")

    async def slowly(tool: str, name: str) -> None:
        if home.slow_s > 0:
            home.journal.log("waiting", tool=tool, label=name)
            try:
                await anyio.sleep(home.slow_s)
            except anyio.get_cancelled_exc_class():
                home.journal.log("cancelled", tool=tool, label=name)
                raise

    @server.tool(name="HassTurnOn", description="Turns on/opens/locks a device or entity", structured_output=False)
    async def hass_turn_on(name: str) -> str:
        await slowly("HassTurnOn", name)
        return home.set_state("HassTurnOn", name, turned_on=True)

    @server.tool(name="HassTurnOff", description="Turns off/closes/unlocks a device or entity", structured_output=False)
    async def hass_turn_off(name: str) -> str:
        await slowly("HassTurnOff", name)
        return home.set_state("HassTurnOff", name, turned_on=False)

    @server.tool(
        name="GetLiveContext",
        description="Provides real-time information about the CURRENT state of devices in the smart home.",
        structured_output=False,
    )
    def get_live_context() -> str:
        return home.live_context()

    if not modern:
        async def handshake_only(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
            if ctx.method == "server/discover":
                raise MCPError(code=METHOD_NOT_FOUND, message="Method not found")
            return await call_next(ctx)

        server.middleware.append(handshake_only)
    return server


class RequireBearerToken:
    """401 for an HTTP request whose Authorization header is not `Bearer <token>`,
    before the MCP app sees it (Home Assistant's own HTTP auth does the same)."""

    def __init__(self, app: ASGIApp, token: str, journal: Journal) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.journal = journal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                self.journal.log("unauthorized", method=scope["method"], path=scope["path"], had_header=bool(given))
                await send({
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(UNAUTHORIZED_BODY)).encode())],
                })
                await send({"type": "http.response.body", "body": UNAUTHORIZED_BODY})
                return
            receive = self._journaled(receive)
        await self.app(scope, receive, send)

    def _journaled(self, receive: Receive) -> Receive:
        """The request as the app reads it, each JSON-RPC message's method
        journaled (`posted`)."""
        body = bytearray()

        async def read() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
                if not message.get("more_body"):
                    try:
                        posted = json.loads(body) if body else None
                    except ValueError:
                        posted = None
                    for item in posted if isinstance(posted, list) else [posted]:
                        if isinstance(item, dict):
                            self.journal.log("posted", method=item.get("method"), requestId=item.get("id"),
                                             params=item.get("params") if item.get("method") == "notifications/cancelled"
                                             else None)
            return message

        return read


async def serve(port: int, token: str, journal: Journal, *, modern: bool, slow_s: float = 0.0) -> None:
    server = build_server(Home(journal, slow_s), modern=modern)
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, stateless_http=True, json_response=True)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    chosen_port = listener.getsockname()[1]
    config = uvicorn.Config(
        RequireBearerToken(app, token, journal), log_level="warning", timeout_graceful_shutdown=2, lifespan="on"
    )
    web = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        async def run_web() -> None:
            await web.serve(sockets=[listener])
            tg.cancel_scope.cancel()  # serve() returned: stopped (a signal) or failed to start

        tg.start_soon(run_web)
        with anyio.fail_after(STARTUP_LIMIT_S):
            while not web.started:
                await anyio.sleep(0.01)
        journal.log("listening", port=chosen_port, modern=modern)
        print(f"PORT {chosen_port}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1; 0 picks a free one")
    parser.add_argument("--journal", help="file to append one JSON line per event to")
    parser.add_argument("--modern", action="store_true", help="also serve the 2026-07-28 revision (server/discover)")
    parser.add_argument("--slow-s", type=float, default=0.0, help="HassTurnOn/Off wait this long before acting")
    args = parser.parse_args()
    token = os.environ.get("HA_TOKEN", "")
    if not token:
        sys.exit("home_assistant: set HA_TOKEN to the token clients must send (Authorization: Bearer <token>)")
    journal = Journal(args.journal)
    journal.log("pid", pid=os.getpid())
    # uvicorn stops on SIGTERM/SIGINT, then re-raises the signal: the process ends by it.
    anyio.run(functools.partial(serve, args.port, token, journal, modern=args.modern, slow_s=args.slow_s))


if __name__ == "__main__":
    main()
