"""What a tool is, and the registry the agent loop consults.

A tool declares its effect: a `read` changes nothing; a `write` changes the
world and must return a `Receipt` saying whether the change is confirmed,
failed or unknown, with evidence. A write may offer `reconcile()`: look at
the world and say whether an unknown write happened.

A tool's `run` is cancelled like any other wait of the turn: it must not
shield itself. Bad arguments raise `ToolError`, which becomes a tool result
the model can see (status "error"), never a crash.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from voice.agent.timer_service import TimerService

Effect = Literal["read", "write"]
ReceiptState = Literal["confirmed", "failed", "unknown"]


class ToolError(Exception):
    """The call cannot be carried out as asked (bad arguments, unknown name)."""


@dataclass(frozen=True)
class Receipt:
    state: ReceiptState
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolOutcome:
    content: Any  # what the model sees (JSON-serialisable)
    receipt: Receipt | None = None  # every write returns one
    phrase: str | None = None  # the tool's own confirmation, spoken only once confirmed


@dataclass(frozen=True)
class ToolContext:
    """What a running tool may know about its call."""

    conversation: str
    turn: int
    tool_call_id: str
    data_dir: Path
    commands: dict[str, list[str]] = field(default_factory=dict)
    kill_after_s: float = 2.0  # SIGTERM -> SIGKILL bound for external processes
    timers: TimerService | None = None  # the timer tools' service (None: timers are not available here)
    command_env: dict[str, str] = field(default_factory=dict)  # the whole environment of commands it runs


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    effect: Effect
    run: Callable[[dict[str, Any], ToolContext], Awaitable[ToolOutcome | Any]]
    timeout_s: float = 10.0
    # (arguments, the dispatch's payload with `at_wall`, when it was logged) -> a receipt; for unknown writes
    reconcile: Callable[[dict[str, Any], dict[str, Any], ToolContext], Awaitable[Receipt]] | None = None
    destructive: bool = False  # a write that may destroy or undo something (MCP: destructiveHint)
    ask_first: bool = False  # the person approves each call before it is dispatched (voice.agent.approvals)
    source: str = ""  # where it comes from: "" built in, else the MCP server's name
    source_id: str = ""  # what grants are kept under (an editor's server: its name and what it runs)
    title: str = ""  # what a person is shown of it, for questions and editors
    origin: str = ""  # its name at its source (an MCP server's own tool name); grants are keyed by it
    # Why it cannot be called now (an MCP server in its back-off), None when it can: nothing is asked then.
    unavailable: Callable[[], str | None] | None = None
    # When whether a call asks, and what its "always" is kept under, depends on its arguments
    # (run_command: the command it names): arguments -> (source, name), or None when the call does not ask.
    asks_for: Callable[[dict[str, Any]], tuple[str, str] | None] | None = None

    def approval_key(self, args: dict[str, Any]) -> tuple[str, str] | None:
        """What this call is asked and remembered under, (source, name) as
        `voice grants` lists it; None when it is dispatched without asking."""
        if not self.ask_first:
            return None
        if self.asks_for is not None:
            return self.asks_for(args)
        return (self.source_id or self.source, self.origin or self.name)

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass
class ToolRegistry:
    tools: Iterable[Tool] = ()
    _by_name: dict[str, Tool] = field(init=False)

    def __post_init__(self) -> None:
        self._by_name = {t.name: t for t in self.tools}

    def get(self, name: str) -> Tool | None:
        return self._by_name.get(name)

    def add(self, tool: Tool) -> None:
        self._by_name[tool.name] = tool

    def schemas(self) -> list[dict[str, Any]]:
        """By name: every request carries them in the same order, however the
        tools joined (an MCP server that started late), so the request's
        prefix, and the server's cache of it, stays the same."""
        return [self._by_name[name].schema() for name in sorted(self._by_name)]

    def names(self) -> list[str]:
        return list(self._by_name)

    def is_write(self, name: str | None) -> bool:
        tool = self._by_name.get(name or "")
        return tool is not None and tool.effect == "write"
