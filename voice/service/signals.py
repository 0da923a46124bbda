"""Ending a command on Ctrl-C or SIGTERM, the one way every entry point does it.

The signals are taken with anyio's receiver, not left to Python's
KeyboardInterrupt: a process started with SIGINT ignored (a script's
background job, a test runner) never raises one, and the receiver is
seen inside the task group, so the cancel is structured like any other.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import anyio
from anyio.abc import TaskStatus

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def cancel_on_signal(scope: anyio.CancelScope, *signals: signal.Signals,
                           on_signal: Callable[[], bool] = lambda: True,
                           task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Cancel `scope` at the first of `signals` (default: SIGINT and SIGTERM)
    for which `on_signal()` returns True; one that returns False was handled
    there (`voice chat`: a Ctrl-C that stopped a reply), and the next is waited for.
    Started with `task_group.start`, it returns once the signals are taken."""
    with anyio.open_signal_receiver(*(signals or STOP_SIGNALS)) as received:
        task_status.started()
        async for _ in received:
            if on_signal():
                scope.cancel()
                return
