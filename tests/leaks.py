"""What a test leaves running: asyncio tasks in its loop, threads in the
process. Used by the autouse checks in conftest.py and by the in-process
timeline harness (tests/timeline.py), which runs its own loop."""

from __future__ import annotations

import asyncio
import threading
import time

import anyio


async def tasks_left(before: set[asyncio.Task], grace_s: float) -> list[asyncio.Task]:
    """Tasks of the running loop started since `before` (a snapshot of
    `asyncio.all_tasks()`) and still running after `grace_s`: a task that
    is finishing its cancellation gets that long."""
    left: list[asyncio.Task] = []
    with anyio.move_on_after(grace_s):
        while left := [t for t in asyncio.all_tasks() if t not in before and not t.done()]:
            await asyncio.sleep(0.01)
    return left


def describe_tasks(tasks: list[asyncio.Task]) -> str:
    return "; ".join(f"{t.get_name()} {t.get_coro()!r}" for t in tasks)


def threads_left(before: set[threading.Thread], grace_s: float,
                 allowed: frozenset[str] = frozenset()) -> list[threading.Thread]:
    """Threads started since `before` (other than those named in `allowed`)
    still alive after `grace_s`: executor workers of a closed loop get that
    long to exit."""
    deadline = time.perf_counter() + grace_s  # perf_counter: never the replay's virtual clock
    while True:
        left = [t for t in threading.enumerate() if t not in before and t.is_alive() and t.name not in allowed]
        if not left or time.perf_counter() > deadline:
            return left
        left[0].join(timeout=max(0.0, deadline - time.perf_counter()))


def describe_threads(threads: list[threading.Thread]) -> str:
    def one(thread: threading.Thread) -> str:
        target = getattr(thread, "_target", None)
        where = getattr(target, "__qualname__", None) or repr(target)
        return f"{thread.name!r} (daemon={thread.daemon}, target={where})"

    return "; ".join(map(one, threads))
