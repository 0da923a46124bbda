"""The autojump virtual clock (voice/audio/clock.py). It patches `time`
process-wide, so every check runs in its own Python subprocess and prints
its measurements as JSON for the test to assert on."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_child(body: str, timeout: float = 60) -> dict:
    code = textwrap.dedent(
        """
        import asyncio, json, time
        from voice.audio.clock import VirtualClock, run_blocking, run_on_virtual_clock
        clock = VirtualClock()
        clock.install()
        """
    ) + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout + proc.stderr
    return json.loads(lines[-1])


def test_idle_sleep_jumps_virtual_time_not_real_time():
    r = run_child(
        """
        async def main():
            m0, t0, p0 = time.monotonic(), time.time(), time.perf_counter()
            loop_t0 = asyncio.get_running_loop().time()
            await asyncio.sleep(30)
            return dict(
                mono=time.monotonic() - m0,
                wall=time.time() - t0,
                real=time.perf_counter() - p0,
                loop=asyncio.get_running_loop().time() - loop_t0,
                ns=time.monotonic_ns(),
                offset=clock.offset,
            )
        r = run_on_virtual_clock(main(), clock)
        r["patched"] = time.monotonic == clock.monotonic and time.time == clock.time
        print(json.dumps(r))
        """
    )
    assert r["real"] < 2.0
    assert r["mono"] >= 30.0
    assert r["wall"] >= 30.0
    assert r["loop"] >= 30.0
    assert r["mono"] < 32.0 and r["wall"] < 32.0  # jumps to the timer, not past it by much
    assert r["offset"] >= 29.0
    assert r["patched"] is True


def test_a_jump_is_time_awake_and_a_test_s_sleep_file_is_time_asleep(tmp_path):
    """The boot-time clock moves with the virtual monotonic one (a replay's
    jumps are no sleep: voice.agent.sleep_watch would take them for one),
    and with VOICE_TEST_SLEEP_FILE the seconds it holds move the boot-time
    and wall clocks on, not the monotonic one, as a suspend does."""
    slept = tmp_path / "slept"
    r = run_child(
        f"""
        from voice.agent.sleep_watch import Clocks
        from pathlib import Path
        clocks = Clocks()
        async def main():
            before = clocks.asleep()
            await asyncio.sleep(100)
            return before, clocks.asleep()
        before, after = run_on_virtual_clock(main(), clock)
        clock.uninstall()
        import os
        os.environ["VOICE_TEST_SLEEP_FILE"] = "{slept}"
        from voice.audio.clock import install_test_sleep
        test = install_test_sleep()
        m0, t0, a0 = time.monotonic(), time.time(), clocks.asleep()
        Path("{slept}").write_text("30")
        a1 = clocks.asleep()  # (the file is read at a reading of the boot-time clock)
        print(json.dumps(dict(jumped=after - before, asleep=a1 - a0, mono=time.monotonic() - m0,
                              wall=time.time() - t0)))
        """
    )
    assert abs(r["jumped"]) < 0.05
    assert r["asleep"] == pytest.approx(30.0, abs=0.05)
    assert r["mono"] < 1.0 and r["wall"] == pytest.approx(30.0, abs=1.0)


def test_executor_work_advances_virtual_time_by_its_real_duration():
    r = run_child(
        """
        async def main():
            m0, p0 = time.monotonic(), time.perf_counter()
            await run_blocking(time.sleep, 0.3)  # the real sleep, in a thread
            return dict(virtual=time.monotonic() - m0, real=time.perf_counter() - p0, in_flight=clock.in_flight)
        print(json.dumps(run_on_virtual_clock(main(), clock)))
        """
    )
    assert 0.25 <= r["virtual"] <= 1.0
    assert r["real"] >= 0.25
    assert r["in_flight"] == 0


def test_a_timer_does_not_jump_past_executor_work_in_flight():
    r = run_child(
        """
        order = []
        async def job():
            await run_blocking(time.sleep, 0.3)
            order.append(("job", time.monotonic()))

        async def sleeper():
            await asyncio.sleep(10)
            order.append(("sleep", time.monotonic()))

        async def main():
            m0, p0 = time.monotonic(), time.perf_counter()
            await asyncio.gather(sleeper(), job())
            return dict(
                order=[name for name, _ in order],
                job_at=order[[n for n, _ in order].index("job")][1] - m0,
                sleep_at=order[[n for n, _ in order].index("sleep")][1] - m0,
                real=time.perf_counter() - p0,
            )
        print(json.dumps(run_on_virtual_clock(main(), clock)))
        """
    )
    assert r["order"] == ["job", "sleep"]
    assert 0.25 <= r["job_at"] <= 1.0, "virtual time jumped while the job was in flight"
    assert r["sleep_at"] >= 10.0
    assert r["real"] < 3.0


def test_busy_prevents_jumping():
    r = run_child(
        """
        async def main():
            p0, m0 = time.perf_counter(), time.monotonic()
            with clock.busy():
                assert clock.in_flight == 1
                await asyncio.sleep(0.2)
            busy_real, busy_virtual = time.perf_counter() - p0, time.monotonic() - m0
            p1, m1 = time.perf_counter(), time.monotonic()
            await asyncio.sleep(5)  # not busy any more: jumps
            return dict(busy_real=busy_real, busy_virtual=busy_virtual, in_flight=clock.in_flight,
                        free_real=time.perf_counter() - p1, free_virtual=time.monotonic() - m1)
        print(json.dumps(run_on_virtual_clock(main(), clock)))
        """
    )
    assert r["busy_real"] >= 0.15
    assert 0.15 <= r["busy_virtual"] < 1.0
    assert r["in_flight"] == 0
    assert r["free_real"] < 1.0
    assert r["free_virtual"] >= 5.0


def test_uninstall_restores_the_real_clock():
    r = run_child(
        """
        real_mono = __import__("voice.audio.clock", fromlist=["x"])._real_monotonic
        async def main():
            await asyncio.sleep(100)
        run_on_virtual_clock(main(), clock)
        skewed = time.monotonic() - real_mono()
        clock.uninstall()
        p0, m0 = time.perf_counter(), time.monotonic()
        time.sleep(0.1)
        print(json.dumps(dict(
            skewed=skewed,
            restored=time.monotonic is real_mono,
            time_restored=time.time is __import__("voice.audio.clock", fromlist=["x"])._real_time,
            gettime_restored=time.clock_gettime is __import__("voice.audio.clock", fromlist=["x"])._real_clock_gettime,
            after=time.monotonic() - real_mono(),
            step=time.monotonic() - m0,
            real_step=time.perf_counter() - p0,
        )))
        """
    )
    assert r["skewed"] >= 99.0  # the offset skipped: 100 s less the real time spent
    assert r["restored"] is True
    assert r["time_restored"] is True and r["gettime_restored"] is True
    assert abs(r["after"]) < 0.05
    assert r["step"] == pytest.approx(r["real_step"], abs=0.05)


def test_a_network_provider_on_the_replay_clock_keeps_real_latency():
    """A model that answers in 0.3 s of real (network) time must take 0.3 s
    on the replay clock too, not be skipped as idle."""
    code = r"""
import asyncio, time
from voice.audio.clock import VirtualClock, run_on_virtual_clock
from voice.agent.providers.base import Finish, ProviderRoute, TextDelta
from voice.agent.providers import _Held  # (#25: the replay's wrapper, now open_provider(hold=...)'s)
clock = VirtualClock(); clock.install()

class Remote:  # waits on a socket-like future, as an HTTP client does
    route = ProviderRoute("openai", "m")
    async def stream(self, request):
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        import threading
        threading.Timer(0.3, lambda: loop.call_soon_threadsafe(done.set_result, None)).start()
        await done
        yield TextDelta("hi"); yield Finish("stop")
    async def aclose(self): pass

async def main():
    async def ticker():  # the replay device's 20 ms ticks: timers the clock could jump to
        while True: await asyncio.sleep(0.02)
    t = asyncio.ensure_future(ticker())
    for provider in (Remote(), _Held(Remote(), clock.busy)):
        v0 = time.monotonic()
        async for _ in provider.stream(None): pass
        print(round(time.monotonic() - v0, 2))
    t.cancel()
run_on_virtual_clock(main(), clock)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    bare, held = (float(x) for x in out.stdout.split())
    assert held == pytest.approx(0.3, abs=0.1)  # held: the real 0.3 s
    assert bare > held + 1.0  # unheld, the clock races ahead over the wait (why the wrapper exists)


def test_with_free_compute_work_in_flight_takes_no_time_and_timers_wait_for_it():
    """A replayed recording: 0.3 s of inference is 0 s on the clock, and a
    timer due meanwhile fires only after the work, at its own virtual time."""
    r = run_child(
        """
        clock.free_compute = True
        order = []
        async def job():
            await run_blocking(time.sleep, 0.3)
            order.append(("job", time.monotonic(), time.time()))

        async def timer():
            await asyncio.sleep(0.05)
            order.append(("timer", time.monotonic(), time.time()))

        async def main():
            m0, w0, p0 = time.monotonic(), time.time(), time.perf_counter()
            await asyncio.gather(job(), timer())
            return dict(order=[name for name, *_ in order], at=[m - m0 for _, m, _ in order],
                        wall=[w - w0 for *_, w in order], real=time.perf_counter() - p0,
                        in_flight=clock.in_flight)
        print(json.dumps(run_on_virtual_clock(main(), clock)))
        """
    )
    assert r["order"] == ["job", "timer"]  # the clock stood still while the job ran
    # The job took no time, and the timer fired at exactly its own time (float rounding aside):
    # the clock stands still between jumps, whatever the loop and the job cost in real time.
    assert r["at"][0] == pytest.approx(0, abs=1e-9) and r["at"][1] == pytest.approx(0.05, abs=1e-9), r
    assert abs(r["wall"][1] - r["at"][1]) < 0.01  # time.time stands still with it
    assert r["real"] >= 0.3 and r["in_flight"] == 0
