"""The computer's sleep (issue #36, point 4): noticed on resume, when the
boot-time clock has run ahead of the monotonic one; a timer that came due
asleep rings once, at resume, saying how late it is; the idle gap counts
the time asleep.

From the outside: `voice run --replay` with a simulated sleep
(VOICE_TEST_SLEEP_FILE, voice.audio.clock: the wall and boot-time clocks
move on by what the file says, the monotonic clock does not, as in a
suspend), the process frozen meanwhile (SIGSTOP), driven by `voice ctl`.
Then the watch itself, on clocks handed in."""

from __future__ import annotations

import re
import signal
import time
import wave

import anyio
import pytest

from autojump import on_autojump, virtual_clock
from voice.agent.sleep_watch import Clocks, SleepWatch
from voice.agent.timer_service import TimerService
from voice.log import events as ev
from voice.log.store import EventStore

ASLEEP_S = 30


def _silence(path, seconds: float = 0.5) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * int(16000 * seconds))


@pytest.mark.slow
def test_a_timer_due_while_the_computer_slept_rings_once_at_resume_and_the_idle_gap_counts_the_sleep(tmp_path):
    from test_conversations import ctl, current_conversation
    from test_service import Daemon

    (tmp_path / "config" / "voice").mkdir(parents=True)
    (tmp_path / "config" / "voice" / "voice.toml").write_text("[conversation]\nidle_gap_s = 10.0\n")
    _silence(tmp_path / "quiet.wav")
    scenario = tmp_path / "quiet.toml"
    scenario.write_text(f'[[user]]\naudio = "{tmp_path / "quiet.wav"}"\nat = 0.1\n')
    slept = tmp_path / "slept"
    d = Daemon(tmp_path, scenario, VOICE_TEST_SLEEP_FILE=str(slept))
    try:
        d.pump(lambda: "READY=1" in d.messages and d.socket.exists())
        talked = current_conversation(d)  # (the one the first request goes to)
        said = ctl(d, "say", "set a timer for 8 seconds")
        assert said.returncode == 0 and "timer for eight seconds is set" in said.stdout, said.stderr

        # The lid closes: the process is frozen while the computer sleeps 30 s (its wall and boot-time
        # clocks move on by that, its monotonic clock does not), and goes on when it wakes.
        d.proc.send_signal(signal.SIGSTOP)
        slept.write_text(f"{ASLEEP_S}\n")
        time.sleep(0.3)
        d.proc.send_signal(signal.SIGCONT)

        rang = "notice: Your eight second timer "
        d.pump(lambda: any(line.startswith(rang) for line in d.out), timeout=30)
        d.pump(lambda: any(e.type == ev.CONVERSATION_END for e in d.events()), timeout=30)
        # Past the timer's own due time on the monotonic clock (the daemon's is this machine's):
        # it does not ring again then.
        (set_at,) = [e.at_mono for e in d.events() if e.type == ev.TIMER_SET]
        time.sleep(max(0.0, set_at + 9 - time.monotonic()))
        asked = ctl(d, "say", "what", "time", "is", "it")
        assert asked.returncode == 0, asked.stderr
        after = current_conversation(d)
    finally:
        d.stop()
    assert d.proc.returncode == 0, d.err_text()
    events = d.events()

    (resumed,) = [e for e in events if e.type == ev.SYSTEM_RESUMED]
    assert ASLEEP_S - 1 <= resumed.payload["asleep_s"] <= ASLEEP_S + 1
    assert [ln for ln in d.out if "asleep" in ln and not ln.startswith(rang)] == [
        "notice: the computer was asleep for thirty seconds; reopening the audio device"]

    # The timer rang once, at resume (not at its monotonic due time, 8 s after it was set), late, and said so.
    (fired,) = [e for e in events if e.type == ev.TIMER_FIRED]
    assert fired.payload["late"] is True and fired.at_mono - resumed.at_mono < 5.0
    assert re.fullmatch(r"Your eight second timer went off [a-z -]+ seconds? ago, while the computer was asleep\.",
                        fired.payload["text"]), fired.payload["text"]
    assert [ln for ln in d.out if ln.startswith(rang)] == [f"notice: {fired.payload['text']}"]

    # The idle gap (10 s) counted the 30 s asleep: the conversation ended at resume, not 10 s of the
    # monotonic clock after its last turn, and the next request opened a new one.
    (end,) = [e for e in events if e.type == ev.CONVERSATION_END]
    assert end.conversation == talked and end.payload["reason"] == "idle" and end.payload["idle_s"] >= ASLEEP_S
    assert end.at_mono - resumed.at_mono < 5.0
    assert after != talked


class _Clocks:
    """A computer whose sleeps a test decides."""

    def __init__(self) -> None:
        self.awake = 100.0
        self.asleep = 0.0

    def clocks(self) -> Clocks:
        return Clocks(monotonic=lambda: self.awake, boottime=lambda: self.awake + self.asleep,
                      wall=lambda: 1.7e9 + self.awake + self.asleep)


def test_a_resume_is_the_boot_time_clock_running_ahead_and_is_told_once():
    machine = _Clocks()
    watch = SleepWatch(machine.clocks())
    told = []
    watch.on_resume(told.append)
    machine.awake += 3600  # an hour awake: nothing
    assert watch.check() is None
    machine.asleep += 1.5  # a short nap, under the threshold: nothing yet
    assert watch.check() is None
    machine.asleep += 40
    resumed = watch.check()
    assert resumed is not None and resumed.asleep_s == pytest.approx(41.5)  # (the nap counts too)
    assert told == [resumed] and resumed.at_wall == pytest.approx(1.7e9 + 100 + 3600 + 41.5)
    assert watch.check() is None and told == [resumed]  # the same sleep is not told twice


@pytest.mark.anyio
@on_autojump
async def test_a_timer_whose_wait_ends_before_the_watch_looked_still_knows_it_slept(tmp_path):
    """The lid closed half a second before a ten-minute timer was due: at
    resume its (monotonic) wait ends at once, before the watch's next look;
    the timer service looks itself, so it rings saying how late, once."""
    clock = virtual_clock()
    asleep = 0.0
    clocks = Clocks(monotonic=clock.monotonic, boottime=lambda: clock.monotonic() + asleep,
                    wall=lambda: clock.time() + asleep)
    watch = SleepWatch(clocks)
    store = EventStore(tmp_path / "events.db")
    said: list[str] = []

    async def announce(text: str) -> None:
        said.append(text)

    timers = TimerService(store, announce, clock=clocks.wall, sleep=watch)
    watch.on_resume(timers.resumed)
    timers.set(600, "", "c-1", None, None)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(timers.run)
            await anyio.sleep(599.5)
            asleep = 2400.0  # forty minutes asleep, and no watch running to notice it
            await anyio.sleep(60)
            tg.cancel_scope.cancel()
        fired = [e.body for e in store.events(types={ev.TIMER_FIRED})]
    finally:
        store.close()
    assert said == ["Your ten minute timer went off forty minutes ago, while the computer was asleep."]
    assert [f.late for f in fired] == [True]
