"""Every configured MCP server, together: started at once, their tools in
one list, the ones that did not start said in a line each.

This module does not import the MCP SDK (voice.agent.mcp.servers does):
a program with no MCP server configured, `voice chat` or a replay, never
pays for that import (0.9 s of a `voice` command's start, measured).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskStatus

from voice.agent.tools.base import Tool

if TYPE_CHECKING:
    from voice.agent.mcp.servers import McpServer


@dataclass
class McpServers:
    """Every configured server; `run` in the app's task group."""

    servers: list[McpServer]

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start every enabled server (together, each within its start_timeout_s),
        report started, then keep their connections until cancelled."""
        async with anyio.create_task_group() as tg:
            for server in self.servers:
                tg.start_soon(server.run)
            async with anyio.create_task_group() as starting:
                for server in self.servers:
                    if server.spec.enabled:
                        starting.start_soon(server.start)
            task_status.started()
            await anyio.sleep_forever()

    def tools(self) -> list[Tool]:
        """Every offered tool, in server then tool order; a name two of them
        would share gets a hash of the second's server and real name."""
        out, taken = [], set()
        for server in self.servers:
            for tool in server.tools():
                if tool.name in taken:
                    digest = hashlib.sha256(f"{server.spec.name}\0{tool.origin}".encode()).hexdigest()[:8]
                    tool = replace(tool, name=tool.name[:55] + "_" + digest)
                taken.add(tool.name)
                out.append(tool)
        return out

    def not_started(self) -> list[str]:
        """One line per server that did not start: said to the person (its
        head aloud), the assistant going on without its tools."""
        return [f"The MCP server {s.spec.name} did not start: {s.error}; its tools are not offered (fix: {s.fix()})"
                for s in self.failed()]

    def warnings(self) -> list[str]:
        """Lines for the log of the service: config that names tools a running server does not have."""
        return [f"mcp: {line}" for s in self.servers if s.state == "running"
                for line in s.spec.unknown_names({t.name for t in s.listed})]

    def failed(self) -> list[McpServer]:
        return [s for s in self.servers if s.state in ("failed", "crashed")]
