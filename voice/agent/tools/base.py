"""What a tool is, and the registry the agent loop consults.

A tool's `run` is cancelled like any other wait of the turn: it must not
shield itself. Bad arguments raise `ToolError`, which becomes a tool result
the model can see (status "error"), never a crash.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

Effect = Literal["read", "write"]


class ToolError(Exception):
    """The call cannot be carried out as asked (bad arguments, unknown name)."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    effect: Effect
    run: Callable[[dict[str, Any]], Awaitable[Any]]
    timeout_s: float = 10.0

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
        return [t.schema() for t in self._by_name.values()]

    def names(self) -> list[str]:
        return list(self._by_name)
