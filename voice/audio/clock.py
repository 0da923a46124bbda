"""An autojump virtual clock for replay (docs/ARCHITECTURE.md, "Replay on a virtual clock").

Virtual time = real time + the idle time skipped so far. The event loop's
selector is wrapped: when the loop would sleep until its next timer and no
work is in flight (no executor job: Whisper, Piper, Silero run there), it
jumps the clock to that timer instead of sleeping. When work is in flight it
sleeps for real, so compute results never arrive "earlier" on the virtual
clock than they would in a live run.

With `free_compute` (replaying a recorded session, whose scenario gives the
recording's own times: when each reply came and where each sentence
played), work in flight takes no virtual time at all: the clock stands
still from the moment a job starts until none is left. Inference that runs
slower (or faster) on this machine than where the session was recorded
then moves nothing.

`time.time`, `time.monotonic` and `time.monotonic_ns` are patched process-
wide, before pipecat is imported (its frames capture `time.time` at import),
so pipecat's wall-clock timeouts see the same clock. `time.perf_counter`
stays real. One such loop per process: `voice replay` runs it in its own
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_real_monotonic = time.monotonic
_real_monotonic_ns = time.monotonic_ns
_real_time = time.time


class VirtualClock:
    def __init__(self) -> None:
        self.offset = 0.0  # seconds skipped (less, with free_compute, the seconds stood still)
        self.in_flight = 0
        self.free_compute = False
        self._still_since: float | None = None  # real monotonic time the clock stopped at (free_compute)

    def _stood(self) -> float:
        """Real seconds since the clock stopped (0 while it runs)."""
        return _real_monotonic() - self._still_since if self._still_since is not None else 0.0

    def monotonic(self) -> float:
        return _real_monotonic() + self.offset - self._stood()

    def monotonic_ns(self) -> int:
        return _real_monotonic_ns() + int((self.offset - self._stood()) * 1e9)

    def time(self) -> float:
        return _real_time() + self.offset - self._stood()

    def begin(self) -> None:
        """Work went in flight (from the loop's thread)."""
        self.in_flight += 1
        if self.free_compute and self.in_flight == 1:
            self._still_since = _real_monotonic()

    def end(self) -> None:
        self.in_flight -= 1
        if self._still_since is not None and self.in_flight == 0:
            self.offset -= self._stood()
            self._still_since = None

    def install(self) -> None:
        time.monotonic = self.monotonic  # type: ignore[assignment]
        time.monotonic_ns = self.monotonic_ns  # type: ignore[assignment]
        time.time = self.time  # type: ignore[assignment]

    def uninstall(self) -> None:
        time.monotonic, time.monotonic_ns, time.time = _real_monotonic, _real_monotonic_ns, _real_time

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


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


async def run_blocking(func: Any, *args: Any) -> Any:
    """Run blocking work (model inference) in the loop's executor, where the
    virtual clock counts it as in flight."""
    return await asyncio.get_running_loop().run_in_executor(None, func, *args)
