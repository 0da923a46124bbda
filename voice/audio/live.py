"""The live device: a sounddevice callback stream.

The callback pulls exactly the samples it hands to the device from the
playback buffer (so the cursor is exact) and performs a requested clear
there. Played time = cursor minus the output latency, which is taken from
the last output callback's own timestamps (PortAudio's DAC time for that
block) and the time elapsed since: measured on PipeWire, that puts the
cursor within 2 ms of the sound leaving (p95), where the stream's static
`latency` put it 14 ms ahead on average and up to 25 ms (it counts from the
block's first sample, and the cursor stands still between callbacks;
benchmarks/live.py). The static figure is only the fallback.
Mic blocks leave the callback through a bounded queue (never blocking it)
and are resampled to 16 kHz mono with soxr on the event loop side.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import numpy as np
import soxr

from voice.audio.device import MAX_MIC_BLOCK, MIC_RATE, OnMic
from voice.audio.playback import PlaybackBuffer, silence
from voice.audio.silence_hold import SilenceHold


class AudioUnavailable(RuntimeError):
    pass


@dataclass
class LiveDevice:
    input_device: int | str | None = None
    output_device: int | str | None = None
    block_ms: int = 20
    # Silent mic blocks may wait up to this long to be handed on together while the
    # service waits (voice.audio.silence_hold); 0: every block at once.
    hold_silence_s: float = 0.0
    hold_floor_dbfs: float = -66.0  # under the listener's sound floor, with a margin
    hold_after_quiet_s: float = 2.0
    buffer: PlaybackBuffer = field(init=False)
    dropped_blocks: int = 0
    _latency_s: float = 0.0  # the stream's reported output latency: the fallback
    _last_block: tuple[float, float, int] | None = None  # (monotonic time, DAC delay s, frames) of the last output
    _in_rate: int = MIC_RATE
    _out_rate: int = MIC_RATE
    _names: tuple[str, str] = ("", "")

    def __post_init__(self) -> None:
        # Held silence and the block that ends it leave as one block: it must stay a block a
        # recording of it can be replayed with (voice.audio.device.MAX_MIC_BLOCK).
        longest_s = self.hold_silence_s + 2 * self.block_ms / 1000
        if longest_s * MIC_RATE > MAX_MIC_BLOCK:
            raise ValueError(f"hold_silence_s = {self.hold_silence_s} with {self.block_ms} ms blocks makes mic blocks "
                             f"of up to {longest_s:g} s, over the {MAX_MIC_BLOCK / MIC_RATE:g} s a block may be")
        try:
            import sounddevice as sd
        except OSError as exc:  # the PortAudio library is missing
            raise AudioUnavailable(f"PortAudio is not installed ({exc}): apt-get install libportaudio2") from None
        try:
            ins = sd.query_devices(self.input_device, "input")
            outs = sd.query_devices(self.output_device, "output")
        except (sd.PortAudioError, ValueError) as exc:  # no sound card, or no such device
            raise AudioUnavailable(
                f"no usable audio device ({exc}); list devices with `{sys.executable} -m sounddevice`, pick one with "
                "[audio] input/output in the config, or use `voice replay` on a headless machine"
            ) from None
        self._in_rate, self._out_rate = int(ins["default_samplerate"]), int(outs["default_samplerate"])
        self._names = (ins["name"], outs["name"])
        self.buffer = PlaybackBuffer(self._out_rate)

    @property
    def out_rate(self) -> int:
        return self._out_rate

    def output_latency(self) -> int:
        """Samples handed to the device that have not left it yet, now."""
        if self._last_block is None:  # no callback timing yet (or any more), or the host API gives none
            return round(self._latency_s * self._out_rate)
        called, delay, frames = self._last_block
        return unplayed(frames, delay, time.monotonic() - called, self._out_rate)

    def describe(self) -> str:
        return f"mic {self._names[0]!r} @ {self._in_rate} Hz, speaker {self._names[1]!r} @ {self._out_rate} Hz"

    async def run(self, on_mic: OnMic) -> None:
        import sounddevice as sd

        loop = asyncio.get_running_loop()
        send, receive = anyio.create_memory_object_stream[list[np.ndarray]](64)
        hold = (SilenceHold(self._in_rate, self._out_rate, floor_dbfs=self.hold_floor_dbfs,
                            quiet_s=self.hold_after_quiet_s, max_s=self.hold_silence_s)
                if self.hold_silence_s > 0 else None)

        def put(block: list[np.ndarray]) -> None:
            try:
                send.send_nowait(block)
            except anyio.WouldBlock:
                self.dropped_blocks += 1  # the loop fell behind: drop mic audio, never block the callback
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # shutting down: the reader is gone

        played: deque[np.ndarray] = deque()  # the echo reference, appended at write time

        def on_output(outdata, frames, time_info, status) -> None:
            # Stamped before the pull: a reader that pairs it with the position before the pull
            # counts a block less as heard, never more.
            delay = time_info.outputBufferDacTime - time_info.currentTime
            self._last_block = (time.monotonic(), delay, frames) if 0 < delay < 1 else None
            samples = self.buffer.pull(frames)  # never written again: the echo reference keeps it as it is
            outdata[:, 0] = samples
            played.append(samples)
            if hold is not None:
                hold.played(samples, silent=samples is silence(frames))

        def on_input(indata, frames, time_info, status) -> None:
            block = indata[:, 0].copy()
            blocks = hold.take(block) if hold is not None else [block]
            if blocks:  # (none: held, silence while the service waits)
                loop.call_soon_threadsafe(put, blocks)

        def on_duplex(indata, outdata, frames, time_info, status) -> None:
            on_output(outdata, frames, time_info, status)
            on_input(indata, frames, time_info, status)

        resampler = soxr.ResampleStream(self._in_rate, MIC_RATE, 1, dtype="int16") if self._in_rate != MIC_RATE else None
        ref_resampler = (soxr.ResampleStream(self._out_rate, MIC_RATE, 1, dtype="int16")
                         if self._out_rate != MIC_RATE else None)
        streams: list = []  # those opened so far: closed again whatever happens next
        try:
            try:
                latency = self._open_streams(sd, streams, on_duplex, on_input, on_output)
                for s in streams:
                    s.start()
            except sd.PortAudioError as exc:  # listed, but it will not open: busy, or gone since the query
                raise AudioUnavailable(
                    f"the audio device would not open (mic {self._names[0]!r}, speaker {self._names[1]!r}: {exc}); "
                    f"close what else uses it, or list devices with `{sys.executable} -m sounddevice` and pick one "
                    "with [audio] input/output in the config") from None
            self._latency_s = float(latency())
            async with receive:
                async for blocks in receive:
                    # Held silence first, then the block just captured; what played meanwhile
                    # goes with the last (the held blocks were captured while the speaker was silent).
                    for i, block in enumerate(blocks):
                        if resampler is not None:
                            block = resampler.resample_chunk(block)
                        reference = np.zeros(0, np.int16)
                        if i == len(blocks) - 1:
                            reference = np.concatenate([played.popleft() for _ in range(len(played))] or [reference])
                            if ref_resampler is not None:
                                reference = ref_resampler.resample_chunk(reference)
                        await on_mic(block.tobytes(), reference.tobytes())
        finally:
            for s in streams:
                s.stop()
                s.close()
            self._last_block = None

    def _open_streams(self, sd, streams: list, on_duplex, on_input, on_output) -> Callable[[], float]:
        """Into `streams` as each opens: one duplex stream when both sides run
        at one rate, else an input and an output stream. Returns how to read
        the output latency."""
        common = dict(channels=1, dtype="int16")
        if self._in_rate == self._out_rate:
            streams.append(sd.Stream(samplerate=self._out_rate, blocksize=self._out_rate * self.block_ms // 1000,
                                     device=(self.input_device, self.output_device), callback=on_duplex, **common))
            return lambda: streams[0].latency[1]
        streams.append(sd.InputStream(samplerate=self._in_rate, blocksize=self._in_rate * self.block_ms // 1000,
                                      device=self.input_device, callback=on_input, **common))
        streams.append(sd.OutputStream(samplerate=self._out_rate, blocksize=self._out_rate * self.block_ms // 1000,
                                       device=self.output_device, callback=on_output, **common))
        return lambda: streams[1].latency


def unplayed(frames: int, dac_delay_s: float, since_s: float, rate: int) -> int:
    """Samples not yet out of the device, `since_s` after a callback handed it
    `frames` whose first sample PortAudio said would play `dac_delay_s` later."""
    return max(0, round(frames + (dac_delay_s - since_s) * rate))
