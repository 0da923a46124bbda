"""What an `AgentLoop` is given besides its store, provider and surface:
its settings (prompt, retries, steps, the context budget) and what tools
get to know and use."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voice.agent.approvals import Approvals
from voice.agent.mcp.all_servers import McpServers
from voice.agent.timer_service import TimerService
from voice.agent.tools.base import ToolContext
from voice.log.window import TokenCounter, estimate_tokens, message_tokens, tools_tokens
from voice.paths import data_dir


@dataclass
class LoopSettings:
    system_prompt: str = ""
    retries: int = 1  # extra attempts after a retryable provider error
    retry_backoff_s: float = 0.5
    max_steps: int = 8
    stop_bound_s: float = 2.0  # shielded clean-up after a cancel
    # The context budget (voice.log.window): a request's messages and tool
    # schemas stay within context_tokens - reply_tokens.
    context_tokens: int = 4096
    reply_tokens: int = 512
    count_tokens: TokenCounter = estimate_tokens
    # After the window moves, send its new prefix for a one-token reply in idle time (voice.agent.side_requests).
    warm_cache: bool = True


@dataclass
class ToolServices:
    """The long-lived services the loop and its tools use, each by name: a
    missing one is None (an app without timers), a misspelt one an
    AttributeError, never a feature silently off."""

    timers: TimerService | None = None
    approvals: Approvals | None = None  # the grants, and where a spoken answer goes (voice.agent.approvals)
    mcp: McpServers | None = None  # the MCP servers, for status: each one's state


@dataclass
class ToolEnv:
    """What tools get to know and use, beyond their arguments."""

    data_dir: Path = field(default_factory=data_dir)
    commands: dict[str, list[str]] = field(default_factory=dict)
    kill_after_s: float = 2.0
    services: ToolServices = field(default_factory=ToolServices)
    command_env: dict[str, str] = field(default_factory=dict)  # see voice.runtime.command_environment

    def context(self, conversation: str, turn: int, tool_call_id: str) -> ToolContext:
        return ToolContext(conversation, turn, tool_call_id, self.data_dir, self.commands, max(0.0, self.kill_after_s),
                           self.services.timers, self.command_env)


def history_budget(s: LoopSettings, schemas: list[dict[str, Any]]) -> int:
    """Tokens left for the conversation once the system prompt, the tool
    schemas and the reply's reserve are counted."""
    fixed = message_tokens({"content": s.system_prompt}, s.count_tokens) + tools_tokens(schemas, s.count_tokens)
    return max(0, s.context_tokens - s.reply_tokens - fixed)
