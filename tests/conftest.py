"""Shared fixtures: the asyncio backend (pipecat is asyncio), a real SQLite
log in tmp_path, scripted providers and a helper that cancels a turn when a
condition on what was delivered holds."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any

import anyio
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from voice.agent.loop import AgentLoop, LoopSettings, TurnResult  # noqa: E402
from voice.agent.providers.scripted import ScriptedProvider, parse_replies  # noqa: E402
from voice.agent.tools import ToolRegistry, default_tools  # noqa: E402
from voice.log.store import EventStore  # noqa: E402
from voice.surfaces.text import TextSurface  # noqa: E402


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def store(tmp_path):
    s = EventStore(tmp_path / "events.db")
    yield s
    s.close()


def scripted(*replies: dict[str, Any]) -> ScriptedProvider:
    return ScriptedProvider(parse_replies(list(replies), "test script"))


def text_agent(
    store: EventStore,
    provider: ScriptedProvider,
    *,
    tools: ToolRegistry | None = None,
    show_reasoning: bool = True,
    conversation: str = "c-test",
    **settings: Any,
) -> tuple[AgentLoop, io.StringIO]:
    out = io.StringIO()
    surface = TextSurface(out=out, show_reasoning=show_reasoning)
    settings.setdefault("retry_backoff_s", 0.01)
    agent = AgentLoop(store, provider, surface, conversation, tools or default_tools(), LoopSettings(**settings))
    return agent, out


def printed_reply(out: io.StringIO) -> str:
    """The text printed on the last assistant line, without label or marker."""
    line = [ln for ln in out.getvalue().splitlines() if ln.startswith("assistant: ")][-1]
    return line.removeprefix("assistant: ").removesuffix(" [stopped]")


async def run_and_cancel_when(
    agent: AgentLoop, text: str, condition: Callable[[], bool], *, timeout: float = 10.0
) -> TurnResult:
    """Run a turn; cancel it (as a barge-in would) as soon as `condition()`
    holds. Fails if the turn ends before the condition was met."""
    results: list[TurnResult] = []

    async def turn() -> None:
        results.append(await agent.run_turn(text))

    async with anyio.create_task_group() as tg:
        tg.start_soon(turn)
        with anyio.fail_after(timeout):
            while not condition():
                assert not results, "the turn ended before the cancel point was reached"
                await anyio.sleep(0.001)
        assert agent.cancel(), "no turn was running at the cancel point"
    return results[0]
