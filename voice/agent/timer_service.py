"""The timer service: timers that live in the log, announced when due
(the tools that set, cancel and list them: voice.agent.tools.timers).

A timer is a `timer/set` event (wall-clock due time, so it survives a
restart), ended by `timer/cancel` or `timer/fired`. The service keeps the
active ones in memory, read from the log once at start and kept up to date
as it writes, so a turn never rescans the log's timer events. Timers are not
conversation state: one set in a conversation that has since ended still
rings. The service sleeps until
the next due time (cancellably) and announces through the surface. A timer
that came due while the assistant was not running is announced once, as
late. So is one that came due while the computer was asleep
(voice.agent.sleep_watch): its wait runs on the monotonic clock, which
stands still in a suspend, so the resume wakes it (`resumed`), and it
rings at once, saying how late it is. A timer cancelled before it fires
never speaks: its wake-up is late output and is only logged.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import anyio
from num2words import num2words

from voice.agent.sleep_watch import Resumed, SleepWatch
from voice.log import events as ev
from voice.log.late import record_late
from voice.log.store import EventStore


@dataclass(frozen=True)
class Timer:
    timer_id: str
    label: str
    seconds: int
    due_wall: float
    conversation: str
    tool_call_id: str | None = None

    def describe(self) -> str:
        return f"{self.label} timer" if self.label else f"{spoken_duration(self.seconds, attributive=True)} timer"


def spoken_duration(seconds: int | float, attributive: bool = False) -> str:
    """90 -> "one minute and thirty seconds", 3600 -> "one hour"."""
    total = max(0, round(seconds))
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    parts = [f"{num2words(n)} {unit}{'' if n == 1 or attributive else 's'}"
             for n, unit in ((h, "hour"), (m, "minute"), (s, "second")) if n]
    return join_words(parts) or "zero seconds"


def join_words(parts: list[str]) -> str:
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else "".join(parts)



@runtime_checkable
class RoutesByConversation(Protocol):
    """An announcer that routes by conversation (ACP: a session per
    conversation): a timer is announced in the conversation that set it."""

    async def to(self, conversation: str, text: str) -> None: ...


class TimerService:
    def __init__(self, store: EventStore, announce: Callable[[str], Awaitable[None]], clock=time.time,
                 sleep: SleepWatch | None = None):
        self.store = store
        self.announce = announce
        self.clock = clock
        self.sleep = sleep  # asked just before a timer rings: did the computer sleep meanwhile?
        self._wake = anyio.Event()
        self._active: dict[str, Timer] | None = None  # read from the log on first use
        self._resumed_at: float | None = None  # wall time of the latest resume: timers due by then slept

    def _timers(self) -> dict[str, Timer]:
        if self._active is None:
            timers: dict[str, Timer] = {}
            for e in self.store.events(types={ev.TIMER_SET, ev.TIMER_CANCEL, ev.TIMER_FIRED}):
                body = e.body
                if isinstance(body, ev.TimerSet):
                    timers[body.timer_id] = Timer(body.timer_id, body.label, body.seconds, body.due_wall,
                                                  e.conversation, body.tool_call_id)
                else:
                    timers.pop(body.timer_id, None)
            self._active = timers
        return self._active

    def active(self) -> list[Timer]:
        return sorted(self._timers().values(), key=lambda t: t.due_wall)

    def set(self, seconds: int, label: str, conversation: str, turn: int | None, tool_call_id: str | None) -> tuple[Timer, int]:
        timer = Timer("t-" + uuid.uuid4().hex[:8], label, seconds, self.clock() + seconds, conversation, tool_call_id)
        event = self.store.record(conversation, ev.TimerSet(timer_id=timer.timer_id, label=label, seconds=seconds,
                                                            due_wall=timer.due_wall, tool_call_id=tool_call_id),
                                  turn=turn)
        self._timers()[timer.timer_id] = timer
        self._poke()
        return timer, event.seq

    def cancel(self, label: str, conversation: str, turn: int | None) -> Timer | None:
        matching = [t for t in self.active() if not label or t.label.lower() == label.lower()]
        if not matching:
            return None
        timer = matching[-1]  # the most recently due of the matching ones
        self.store.record(conversation, ev.TimerCancel(timer_id=timer.timer_id), turn=turn)
        self._timers().pop(timer.timer_id, None)
        self._poke()
        return timer

    def _poke(self) -> None:
        self._wake.set()
        self._wake = anyio.Event()

    def resumed(self, resumed: Resumed) -> None:
        """The computer woke (voice.agent.sleep_watch): what came due while
        it slept rings now, late (the wait for it stood still)."""
        self._resumed_at = resumed.at_wall
        self._poke()

    async def run(self) -> None:
        """Announce timers as they come due, until cancelled. Timers already
        overdue at start came due while the assistant was down: late."""
        for timer in self.active():
            if timer.due_wall <= self.clock():
                await self._fire(timer, late=True)
        while True:
            timers = self.active()
            wake = self._wake
            if not timers:
                await wake.wait()
                continue
            timer = timers[0]
            with anyio.move_on_after(max(0.0, timer.due_wall - self.clock())):
                await wake.wait()
                continue
            if self.sleep is not None:  # a wait that ends right after a resume, before the watch noticed it
                self.sleep.check()
            await self._fire(timer, late=False)

    async def _fire(self, timer: Timer, late: bool) -> None:
        if timer.timer_id not in {t.timer_id for t in self.active()}:  # cancelled meanwhile: no authority
            record_late(self.store, timer.conversation, "timer", timer_id=timer.timer_id)
            return
        ago = max(0, round(self.clock() - timer.due_wall))
        if late:
            text = f"Your {timer.describe()} went off {spoken_duration(ago)} ago, while I was not running."
        elif ago >= 1 and self._resumed_at is not None and timer.due_wall <= self._resumed_at:
            late = True  # it came due while the computer was asleep
            text = f"Your {timer.describe()} went off {spoken_duration(ago)} ago, while the computer was asleep."
        else:
            text = f"Your {timer.describe()} is done."
        self.store.record(timer.conversation, ev.TimerFired(timer_id=timer.timer_id, late=late, at_wall=self.clock(),
                                                            text=text))
        self._timers().pop(timer.timer_id, None)
        if isinstance(self.announce, RoutesByConversation):
            await self.announce.to(timer.conversation, text)
        else:
            await self.announce(text)
