"""An autojump virtual clock for replay (docs/topics/replay.md).

Virtual time = real time + the idle time skipped so far. The event loop's
selector is wrapped: when the loop would sleep until its next timer and no
work is in flight (no executor job: Whisper, Piper, Silero run there), it
jumps the clock to that timer instead of sleeping. When work is in flight it
sleeps for real, so compute results never arrive "earlier" on the virtual
clock than they would in a live run.

With `free_compute` (replaying a recorded session, whose scenario gives the
recording's own times: when each reply came and where each sentence
played), computing takes no virtual time at all: the clock stands still
and moves only by its jumps to the next timer, taken when no job is in
flight. Inference, and the loop's own work between timers, that runs
slower (or faster) on this machine than where the session was recorded
then moves nothing: the same recording replays to the same audio on any
machine (tests/test_same_replay_twice.py). Standing still only while a job
was in flight was not enough: the loop's own work between two jobs still
ran on the real clock, and one replay in a few under load answered a
20 ms block later.

`time.time`, `time.monotonic` and `time.monotonic_ns` are patched process-
wide, before pipecat is imported (its frames capture `time.time` at import),
so pipecat's wall-clock timeouts see the same clock; so is
`time.clock_gettime` for the monotonic and the boot-time clock (the boot-
time clock is the virtual monotonic one: the jumps are time awake, not
asleep; voice.agent.sleep_watch). `time.perf_counter` stays real. One such
loop per process: `voice replay` runs it in its own process.

For tests only, a simulated sleep: with `VOICE_TEST_SLEEP_FILE=PATH` in the
environment (read here and nowhere else), every command installs this clock
(`install_test_sleep`, without the jumping loop: real time), and PATH holds
the seconds the computer has slept so far (absent or empty: none). Read at
each reading of the boot-time clock, they move it and the wall clock on,
and not the monotonic clock: a suspend as Linux has it. A test writes `30`
there (with the process stopped, SIGSTOP, or not) and the next look at the
clocks finds the computer woke from 30 s asleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_real_monotonic = time.monotonic
_real_monotonic_ns = time.monotonic_ns
_real_time = time.time
_real_clock_gettime = time.clock_gettime
SLEEP_FILE_ENV = "VOICE_TEST_SLEEP_FILE"  # tests only: see the module's docstring


class VirtualClock:
    def __init__(self) -> None:
        self.offset = 0.0  # seconds jumped (less, once free_compute ends, the seconds stood still)
        self.in_flight = 0
        self._still_since: float | None = None  # real monotonic time the clock stopped at (free_compute)
        self._still_wall = 0.0  # and the real wall-clock time then
        self.slept = 0.0  # seconds asleep (simulated): on the wall and boot-time clocks, not the monotonic one
        sleep_file = os.environ.get(SLEEP_FILE_ENV)
        self._sleep_file = Path(sleep_file) if sleep_file else None

    @property
    def free_compute(self) -> bool:
        return self._still_since is not None

    @free_compute.setter
    def free_compute(self, on: bool) -> None:
        if on and self._still_since is None:  # from now on only the jumps move the clock
            self._still_since, self._still_wall = _real_monotonic(), _real_time()
        elif not on and self._still_since is not None:
            self.offset -= _real_monotonic() - self._still_since
            self._still_since = None

    # Standing still, the time is the moment it stopped plus the jumps, computed
    # without a real-clock reading: a timer then fires at exactly its own time.
    def monotonic(self) -> float:
        if self._still_since is not None:
            return self._still_since + self.offset
        return _real_monotonic() + self.offset

    def monotonic_ns(self) -> int:
        if self._still_since is not None:
            return round((self._still_since + self.offset) * 1e9)
        return _real_monotonic_ns() + int(self.offset * 1e9)

    def time(self) -> float:
        if self._still_since is not None:
            return self._still_wall + self.offset + self.slept
        return _real_time() + self.offset + self.slept

    def boottime(self) -> float:
        """The monotonic clock and the time asleep (the test's file read now)."""
        if self._sleep_file is not None:
            try:
                text = self._sleep_file.read_text().strip()
            except FileNotFoundError:
                text = ""
            self.slept = max(self.slept, float(text or 0))  # (a computer does not sleep backwards)
        return self.monotonic() + self.slept

    def clock_gettime(self, clock: int) -> float:
        if clock == time.CLOCK_MONOTONIC:
            return self.monotonic()
        if sys.platform == "linux" and clock == time.CLOCK_BOOTTIME:
            return self.boottime()
        return _real_clock_gettime(clock)

    def begin(self) -> None:
        """Work went in flight (from the loop's thread): the clock will not jump over it."""
        self.in_flight += 1

    def end(self) -> None:
        self.in_flight -= 1

    def install(self) -> None:
        time.monotonic = self.monotonic  # type: ignore[assignment]
        time.monotonic_ns = self.monotonic_ns  # type: ignore[assignment]
        time.time = self.time  # type: ignore[assignment]
        time.clock_gettime = self.clock_gettime  # type: ignore[assignment]

    def uninstall(self) -> None:
        time.monotonic, time.monotonic_ns, time.time = _real_monotonic, _real_monotonic_ns, _real_time
        time.clock_gettime = _real_clock_gettime

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Mark work that is not an executor job (e.g. an HTTP request to a
        language model) as in flight, so the clock does not jump over it."""
        self.begin()
        try:
            yield
        finally:
            self.end()


class _JumpingSelector:
    def __init__(self, inner: Any, clock: VirtualClock):
        self._inner = inner
        self._clock = clock

    def select(self, timeout: float | None = None) -> list:
        if timeout is None or timeout <= 0 or self._clock.in_flight:
            return self._inner.select(timeout)
        ready = self._inner.select(0)
        if ready:
            return ready
        self._clock.offset += timeout  # nothing can happen before the next timer: skip to it
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class AutojumpEventLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock):
        super().__init__()
        self.clock = clock
        self._selector = _JumpingSelector(self._selector, clock)  # type: ignore[assignment]

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> asyncio.Future:
        self.clock.begin()
        future = super().run_in_executor(executor, func, *args)
        future.add_done_callback(lambda _: self.clock.end())
        return future


def run_on_virtual_clock(main: Coroutine[Any, Any, T], clock: VirtualClock) -> T:
    """Run `main` on an autojump loop. The clock must already be installed."""
    loop = AutojumpEventLoop(clock)
    interrupted = False
    try:
        asyncio.set_event_loop(loop)
        task = loop.create_task(main)

        def on_interrupt(signum: int, frame: Any) -> None:
            # Ctrl-C cancels the main task, as asyncio.run does: a KeyboardInterrupt raised
            # in the middle of the loop would leave its scopes to be closed from another task.
            nonlocal interrupted
            if interrupted:  # a second Ctrl-C: stop now
                raise KeyboardInterrupt
            interrupted = True
            loop.call_soon_threadsafe(task.cancel)

        previous = signal.signal(signal.SIGINT, on_interrupt) if _main_thread() else None
        try:
            result = loop.run_until_complete(task)
        except asyncio.CancelledError:
            if interrupted:
                raise KeyboardInterrupt from None
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if interrupted:  # the main task ended early, as it was asked to
            raise KeyboardInterrupt
        return result
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        asyncio.set_event_loop(None)
        loop.close()


def install_test_sleep() -> VirtualClock | None:
    """Tests only: with VOICE_TEST_SLEEP_FILE set, this clock, installed
    (real time, no jumps) so the test can make the computer sleep; see the
    module's docstring. Without it, nothing."""
    if not os.environ.get(SLEEP_FILE_ENV):
        return None
    clock = VirtualClock()
    clock.install()
    return clock


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


async def run_blocking(func: Any, *args: Any) -> Any:
    """Run blocking work (model inference) in the loop's executor, where the
    virtual clock counts it as in flight."""
    return await asyncio.get_running_loop().run_in_executor(None, func, *args)
