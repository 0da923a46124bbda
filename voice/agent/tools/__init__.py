"""Tools the agent can call. Each declares its effect (read or write) and a
timeout; `ToolRegistry` turns them into the provider's tool schemas."""

from voice.agent.tools.base import Tool, ToolError, ToolRegistry
from voice.agent.tools.clock import get_time_tool

__all__ = ["Tool", "ToolError", "ToolRegistry", "get_time_tool", "default_tools"]


def default_tools() -> ToolRegistry:
    return ToolRegistry([get_time_tool()])
