"""LiveDevice.output_latency(): from the last output callback's DAC time and
the time since (what benchmarks/live.py measured to be right on PipeWire),
the stream's static latency only before the first callback, after the stream
stops, or when the host API gives no timestamps. No sound card needed: a
one-callback fake sounddevice."""

from __future__ import annotations

import sys
import threading
import time
import types
from dataclasses import dataclass

import anyio
import numpy as np
import pytest

from voice.audio.live import LiveDevice, unplayed

RATE = 16000


@dataclass
class Times:
    inputBufferAdcTime: float
    outputBufferDacTime: float
    currentTime: float


def fake_sounddevice(dac_delay: float, static: float = 0.04):
    """An input and an output stream (as LiveDevice opens them) that each
    make one callback (the output's DAC time `dac_delay` after now), then
    hold until stopped."""
    called = threading.Event()

    class Stream:
        def __init__(self, *, callback, blocksize, **kw):
            self.callback, self.frames, self.halt = callback, blocksize, threading.Event()

        def start(self):
            def run():
                self.call(np.zeros((self.frames, 1), np.int16), Times(100.0, 100.0 + dac_delay, 100.0))
                self.halt.wait(5)
            threading.Thread(target=run, daemon=True).start()

        def stop(self):
            self.halt.set()

        abort = stop  # (the device aborts a stream it closes: PortAudio cancels its thread)

        def close(self):
            pass

    class InputStream(Stream):
        latency = 0.01

        def call(self, indata, times) -> None:
            self.callback(indata, self.frames, times, None)

    class OutputStream(Stream):
        latency = static

        def call(self, outdata, times) -> None:
            self.callback(outdata, self.frames, times, None)
            called.set()

    sd = types.ModuleType("sounddevice")
    sd.PortAudioError = RuntimeError
    sd.query_devices = lambda device=None, kind=None: {"name": "fake", "default_samplerate": float(RATE)}
    sd.InputStream, sd.OutputStream = InputStream, OutputStream
    return sd, called


def test_unplayed_counts_down_from_the_callback():
    assert unplayed(320, 0.045, 0.0, RATE) == 320 + 720
    assert unplayed(320, 0.045, 0.010, RATE) == 320 + 560
    assert unplayed(320, 0.045, 0.065, RATE) == 0  # all of it has played
    assert unplayed(320, 0.045, 1.0, RATE) == 0


@pytest.mark.anyio
@pytest.mark.parametrize("dac_delay, dynamic", [(0.045, True), (0.0, False), (-5.0, False)])
async def test_output_latency_follows_the_last_callback(monkeypatch, dac_delay, dynamic):
    sd, called = fake_sounddevice(dac_delay)
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    dev = LiveDevice()
    assert dev.output_latency() == 0  # nothing known before the stream runs

    async def on_mic(*blocks: bytes) -> None:
        pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(dev.run, on_mic)
        with anyio.fail_after(5):
            while not called.is_set():
                await anyio.sleep(0.001)
        before = time.monotonic()
        first = dev.output_latency()
        await anyio.sleep(0.02)
        second = dev.output_latency()
        after = time.monotonic()
        tg.cancel_scope.cancel()
    if dynamic:
        # 320 frames handed + 45 ms until the first of them plays, counted down since the callback
        assert 320 + 720 - 0.05 * RATE <= first <= 320 + 720
        assert first - second >= 0.02 * RATE - 2 and first - second <= (after - before) * RATE + 2
    else:  # no usable timestamps: the stream's reported latency
        assert first == second == round(0.04 * RATE)
    assert dev.output_latency() == round(0.04 * RATE)  # stopped: the static figure again
