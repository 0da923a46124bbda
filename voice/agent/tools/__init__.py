"""Tools the agent can call. Each declares its effect (read or write) and a
timeout; writes return receipts. `default_tools()` is the built-in set."""

from collections.abc import Mapping

from voice.agent.tools.base import ToolRegistry
from voice.agent.tools.clock import get_time_tool


def default_tools(commands: dict[str, list[str]] | None = None, *, approve: str = "writes",
                  approve_commands: Mapping[str, str] | None = None) -> ToolRegistry:
    """The built-in tools; run_command only when commands are configured,
    asking first as `approve` (`tools.approve`) and `approve_commands` say."""
    from voice.agent.tools.notes import notes_tools
    from voice.agent.tools.timers import timer_tools

    tools = [get_time_tool(), *timer_tools(), *notes_tools()]
    if commands:
        from voice.agent.tools.commands import run_command_tool

        tools.append(run_command_tool(sorted(commands), approve=approve, approve_commands=approve_commands))
    return ToolRegistry(tools)
