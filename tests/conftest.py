"""Shared fixtures: the asyncio backend (pipecat is asyncio), a real SQLite
log in tmp_path, scripted providers, a helper that cancels a turn when a
condition on what was delivered holds, and the leak checks every test gets
(no thread or task left running after it)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import io
import os
import sys
import threading
from pathlib import Path
from collections.abc import Callable
from typing import Any

import anyio
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Bytecode is cached (#37). Where PYTHONDONTWRITEBYTECODE is set (this project's build machines have
# it), every `voice` subprocess of the suite (hundreds) compiled the package again, and each worker
# rewrote every test module's asserts again: 0.30 -> 0.19 s CPU per `voice chat`, measured.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

from voice.agent.loop import AgentLoop  # noqa: E402
from voice.agent.loop_settings import LoopSettings  # noqa: E402
from voice.agent.turn_state import TurnResult  # noqa: E402
from voice.agent.providers.scripted import ScriptedProvider, parse_replies  # noqa: E402
from voice.agent.tools.base import ToolRegistry  # noqa: E402
from voice.agent.tools import default_tools  # noqa: E402
from voice.log.store import EventStore  # noqa: E402
from voice.surfaces.text import TextSurface  # noqa: E402

from leaks import describe_tasks, describe_threads, tasks_left, threads_left  # noqa: E402


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
    """The last reply printed, without label or marker: from the last
    `assistant: ` label to the end, its own newlines included (a model's
    "1. The Lighthouse\n\nThe keeper…" goes on below the label's line; read
    as one line, a reply cut after its first line was once taken for all
    that was printed)."""
    printed = out.getvalue()
    assert "assistant: " in printed, printed
    return printed.rsplit("assistant: ", 1)[1].removesuffix("\n").removesuffix(" [stopped]")


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


# -- leaks: no test leaves a thread or a task running behind it ---------------
#
# A thread the test started must have ended by the time the test is torn
# down (after a short grace: executor workers of a closed loop exit once
# their queue is shut down). An asyncio task an async test started must have
# ended when the test's coroutine returns, while its loop still runs (the
# anyio runner would otherwise cancel it silently as it closes the loop).
# A test that leaves a thread by design says so, with the reason:
#     @pytest.mark.leaves_thread("stdin-reader", reason="...")

THREAD_GRACE_S = 2.0
TASK_GRACE_S = 0.5
# Threads a library keeps for the life of the process by design, started by
# whichever test first needs them: not a leak of the code under test.
PROCESS_THREADS = {
    "tqdm_monitor": "tqdm's monitor of progress bars (model loading shows one), one per process, a daemon",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "leaves_thread(name, reason=...): the test may leave a thread of that name running, and why")


LIVE = Path(__file__).parent / "live"


@pytest.hookimpl(optionalhook=True)  # (pytest-xdist's hook: absent with -p no:xdist)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): one worker more than the machine has
    cores, at most 6. The live tests run one after another on one worker and
    spend most of their time waiting on real time (audio played into the
    microphone, replies played out); the daemons of the record-and-replay
    tests run in real time too. With a worker per core that core idled
    meanwhile: on 2 cores, 2 workers kept them 75 % busy and the suite took
    15 min 43 s, 3 workers 13 min 25 s (#37, one .ci/run each, idle)."""
    return min(6, (os.cpu_count() or 1) + 1)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups off the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The live tests (one private PipeWire per module, real-time audio) run
    one after another on one pytest-xdist worker (`--dist loadgroup`). The
    tests of a module that share a module-scoped fixture (a daemon, a set of
    replays, a model server) run on one worker too: shared out one by one,
    each worker that got one of them would build the fixture again (#37).
    The rest are shared out between the workers."""
    for item in items:
        if LIVE in Path(item.path).parents:
            item.add_marker(pytest.mark.xdist_group("live"))
        elif shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(Path(item.path).stem))


def shares_a_module_fixture(item: pytest.Item) -> bool:
    # (the last definition of a name is the one the test gets: the others are overridden)
    return isinstance(item, pytest.Function) and any(
        defs[-1].scope == "module" for defs in item._fixtureinfo.name2fixturedefs.values())


@pytest.fixture(autouse=True)
def no_leaked_threads(request: pytest.FixtureRequest):
    before = set(threading.enumerate())
    yield
    marks = list(request.node.iter_markers("leaves_thread"))
    for m in marks:
        assert m.kwargs.get("reason"), f"leaves_thread({m.args[0]!r}) needs a reason="
    left = threads_left(before, THREAD_GRACE_S, frozenset(PROCESS_THREADS) | {m.args[0] for m in marks})
    if left:
        pytest.fail(f"the test left {len(left)} thread(s) running: {describe_threads(left)}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """Async tests (run by anyio's plugin) are checked for tasks they leave,
    before the plugin closes their loop."""
    test = pyfuncitem.obj
    if not inspect.iscoroutinefunction(test) or "anyio_backend" not in pyfuncitem.funcargs:
        return (yield)

    @functools.wraps(test)
    async def checked(**kwargs: Any) -> None:
        before = asyncio.all_tasks()
        await test(**kwargs)
        left = await tasks_left(before, TASK_GRACE_S)
        if left:
            for task in left:
                task.cancel()
            pytest.fail(f"the test left {len(left)} task(s) running: {describe_tasks(left)}", pytrace=False)

    pyfuncitem.obj = checked
    try:
        return (yield)
    finally:
        pyfuncitem.obj = test
