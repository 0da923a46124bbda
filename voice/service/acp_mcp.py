"""An ACP session's own MCP servers: the `mcpServers` an editor gives in
`session/new` or `session/load` (stdio and http), as server specs, and the
task they run in for as long as the session is held (voice.service.acp_server)."""

from __future__ import annotations

import re
from typing import Any

import anyio

from voice.agent.mcp.all_servers import McpServers
from voice.agent.mcp.settings import ServerSpec


def editor_servers(given: list[Any], taken: set[str]) -> tuple[list[ServerSpec], list[str]]:
    """The client's mcpServers as server specs (stdio and http), and a line
    for each that cannot be used."""
    specs, refused, names = [], [], set(taken)
    for server in given:
        kind = getattr(server, "type", None) or "stdio"
        name = re.sub(r"[^A-Za-z0-9_-]", "_", getattr(server, "name", "") or "server")[:32] or "server"
        if name in names:
            refused.append(f"the MCP server {server.name!r} has the name of another server; it was not started")
            continue
        names.add(name)
        if kind == "http":
            headers = tuple((h.name, h.value) for h in server.headers or [])
            specs.append(ServerSpec(name=name, url=server.url, given_headers=headers, given_by="editor"))
        elif kind == "stdio" or hasattr(server, "command"):
            env = tuple((v.name, v.value) for v in getattr(server, "env", None) or [])
            specs.append(ServerSpec(name=name, command=server.command, args=tuple(server.args or []), env=env,
                                    given_by="editor"))
        else:
            refused.append(f"the MCP server {server.name!r} uses {kind}, which this agent does not support "
                           "(stdio and http only)")
    return specs, refused


async def run_session_servers(servers: McpServers, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """A session's MCP servers, until its scope is cancelled (the session let
    go) or the agent ends."""
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            await tg.start(servers.run)
            task_status.started(scope)
