"""The computer's sleep, noticed on resume.

A laptop sleeps with the lid closed: the process is frozen, and on Linux
the monotonic clock (`time.monotonic`, which every wait and timeout of the
event loop runs on) stands still meanwhile, while the boot-time clock
(`CLOCK_BOOTTIME`) and the wall clock go on. So the boot-time clock running
ahead of the monotonic one is a resume, and by how much is the time asleep.
Nothing else moves them apart (both are slewed alike by NTP).

Without this a wait that spans a suspend ends as many monotonic seconds
after the resume as it had left before it: a timer due during the night
rang hours late, saying it "is done", and an idle conversation ended late.

`SleepWatch.check()` compares the two clocks with their last reading at a
resume (or at start); `run()` checks every `CHECK_S`, so a resume is
noticed within that. A resume is told to the listeners (the voice session
reopens its speaker and microphone; the timer service rings what came due)
synchronously, in order, before `check()` returns: nothing else runs in
between, so a timer that rings at resume is never cut by the reopening of
the speaker. The timer service also checks just before it rings, so a
timer whose monotonic wait ends right after a resume is told it slept.

The clocks are read through `Clocks`, from the `time` module at each
reading, so a test can hand in its own, and a replay's virtual clock
(voice.audio.clock, which patches the `time` module) moves them both.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

# The boot-time clock ahead of the monotonic one by more than this since the
# last reading is a resume. Nothing but a suspend moves them apart; reading
# the two one after the other can be off by a scheduling delay (milliseconds,
# tens on a loaded machine), and a sleep of a second or two changes nothing a
# person notices (a timer a second late), while a suspend and resume cycle
# itself takes seconds.
RESUMED_AFTER_S = 2.0
CHECK_S = 1.0  # a resume is noticed within this (a wake-up of the loop a second)


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class Clocks:
    """The two clocks a suspend is told by, and the wall clock. Defaults:
    the `time` module's, read at each call (a replay's virtual clock
    patches them); a test hands in its own. Off Linux there is no boot-time
    clock: the monotonic one stands for it and no sleep is ever noticed."""

    monotonic: Callable[[], float] = lambda: time.monotonic()
    boottime: Callable[[], float] = _boottime if sys.platform == "linux" else lambda: time.monotonic()
    wall: Callable[[], float] = lambda: time.time()

    def asleep(self) -> float:
        """Seconds asleep since boot (plus a constant): grows only in a
        suspend. The boot-time clock is read between two monotonic readings
        and set against their middle: a delay between the readings is
        halved, not counted as sleep."""
        before = self.monotonic()
        boot = self.boottime()
        return boot - (before + self.monotonic()) / 2


@dataclass(frozen=True)
class Resumed:
    """The computer woke after `asleep_s` seconds asleep; noticed at wall time `at_wall`."""

    asleep_s: float
    at_wall: float


OnResume = Callable[[Resumed], None]


class SleepWatch:
    def __init__(self, clocks: Clocks | None = None, threshold_s: float = RESUMED_AFTER_S):
        self.clocks = clocks or Clocks()
        self.threshold_s = threshold_s
        self._asleep = self.clocks.asleep()  # at start, or at the last resume
        self._listeners: list[OnResume] = []

    def on_resume(self, listener: OnResume) -> None:
        """Tell `listener` each resume (on the event loop, synchronously: it must not block)."""
        self._listeners.append(listener)

    def forget(self, listener: OnResume) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def check(self) -> Resumed | None:
        """Whether the computer slept since the last resume (or the start);
        a resume is told to every listener, in order, before this returns."""
        asleep = self.clocks.asleep()
        # (compared with the last resume, not the last check: sleeps too short to count add up)
        slept = asleep - self._asleep
        if slept <= self.threshold_s:
            return None
        self._asleep = asleep
        resumed = Resumed(slept, self.clocks.wall())
        for listener in list(self._listeners):
            listener(resumed)
        return resumed

    async def run(self) -> None:
        """Check every `CHECK_S` (monotonic: the first wait after a resume
        ends `CHECK_S` after it at most), until cancelled."""
        while True:
            await anyio.sleep(CHECK_S)
            self.check()
