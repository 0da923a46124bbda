"""The autojump clock for async tests of code that takes a clock (a
`TimerService`, a back-off): `voice replay`'s autojump loop
(voice.audio.clock), its time read from its own `VirtualClock` instead of a
process-wide patch of `time`, so nothing outside the test's loop sees it.

    pytestmark = pytest.mark.anyio
    @on_autojump
    async def test_x(): ...
        wall = virtual_wall()  # the wall clock the code under test is given

An idle wait (a sleep, a `move_on_after`, a timer's deadline) costs no real
time, so a test may wait for a timer's whole second and still prove its
order of events. Work in the loop's executor holds the clock (as in a
replay); work in anyio's worker threads and in other processes is not seen
and would be jumped over: use this loop only where what the test waits for
is a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from voice.audio.clock import AutojumpEventLoop, VirtualClock


class AutojumpTestLoop(AutojumpEventLoop):
    def __init__(self) -> None:
        super().__init__(VirtualClock())  # a fresh clock for every test

    def time(self) -> float:  # the loop's timers on the virtual clock, without patching `time`
        return self.clock.monotonic()


AUTOJUMP = ("asyncio", {"loop_factory": AutojumpTestLoop})


def virtual_clock() -> VirtualClock:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, AutojumpTestLoop), "not on the autojump loop: parametrize anyio_backend with AUTOJUMP"
    return loop.clock


def virtual_wall() -> Callable[[], float]:
    """Wall-clock seconds on the running test's virtual clock (what a
    component that takes `clock=time.time` is given)."""
    return virtual_clock().time


# Runs the test on the autojump loop (overrides conftest's `anyio_backend`).
on_autojump = pytest.mark.parametrize("anyio_backend", [AUTOJUMP], ids=["autojump"])
