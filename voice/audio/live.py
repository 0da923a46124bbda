"""The live device: a sounddevice callback stream.

The callback pulls exactly the samples it hands to the device from the
playback buffer (so the cursor is exact) and performs a requested clear
there. Played time = cursor minus the stream's reported output latency.
Mic blocks leave the callback through a bounded queue (never blocking it)
and are resampled to 16 kHz mono with soxr on the event loop side.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import anyio
import numpy as np
import soxr

from voice.audio.device import MIC_RATE, OnMic
from voice.audio.playback import PlaybackBuffer


class AudioUnavailable(RuntimeError):
    pass


@dataclass
class LiveDevice:
    input_device: int | str | None = None
    output_device: int | str | None = None
    block_ms: int = 20
    buffer: PlaybackBuffer = field(init=False)
    dropped_blocks: int = 0
    _latency_s: float = 0.0
    _in_rate: int = MIC_RATE
    _out_rate: int = MIC_RATE
    _names: tuple[str, str] = ("", "")

    def __post_init__(self) -> None:
        try:
            import sounddevice as sd
        except OSError as exc:  # the PortAudio library is missing
            raise AudioUnavailable(f"PortAudio is not installed ({exc}): apt-get install libportaudio2") from None
        try:
            ins = sd.query_devices(self.input_device, "input")
            outs = sd.query_devices(self.output_device, "output")
        except (sd.PortAudioError, ValueError) as exc:  # no sound card, or no such device
            raise AudioUnavailable(
                f"no usable audio device ({exc}); list devices with `python -m sounddevice`, pick one with "
                "[audio] input/output in the config, or use `voice replay` on a headless machine"
            ) from None
        self._in_rate, self._out_rate = int(ins["default_samplerate"]), int(outs["default_samplerate"])
        self._names = (ins["name"], outs["name"])
        self.buffer = PlaybackBuffer(self._out_rate)

    @property
    def out_rate(self) -> int:
        return self._out_rate

    def output_latency(self) -> int:
        return round(self._latency_s * self._out_rate)

    def describe(self) -> str:
        return f"mic {self._names[0]!r} @ {self._in_rate} Hz, speaker {self._names[1]!r} @ {self._out_rate} Hz"

    async def run(self, on_mic: OnMic) -> None:
        import sounddevice as sd

        loop = asyncio.get_running_loop()
        send, receive = anyio.create_memory_object_stream[np.ndarray](64)

        def put(block: np.ndarray) -> None:
            try:
                send.send_nowait(block)
            except anyio.WouldBlock:
                self.dropped_blocks += 1  # the loop fell behind: drop mic audio, never block the callback
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # shutting down: the reader is gone

        def on_output(outdata, frames, time_info, status) -> None:
            outdata[:, 0] = self.buffer.pull(frames)

        def on_input(indata, frames, time_info, status) -> None:
            loop.call_soon_threadsafe(put, indata[:, 0].copy())

        def on_duplex(indata, outdata, frames, time_info, status) -> None:
            on_output(outdata, frames, time_info, status)
            on_input(indata, frames, time_info, status)

        common = dict(channels=1, dtype="int16")
        if self._in_rate == self._out_rate:
            streams = [sd.Stream(samplerate=self._out_rate, blocksize=self._out_rate * self.block_ms // 1000,
                                 device=(self.input_device, self.output_device), callback=on_duplex, **common)]
            latency = lambda: streams[0].latency[1]  # noqa: E731
        else:
            streams = [
                sd.InputStream(samplerate=self._in_rate, blocksize=self._in_rate * self.block_ms // 1000,
                               device=self.input_device, callback=on_input, **common),
                sd.OutputStream(samplerate=self._out_rate, blocksize=self._out_rate * self.block_ms // 1000,
                                device=self.output_device, callback=on_output, **common),
            ]
            latency = lambda: streams[1].latency  # noqa: E731
        resampler = soxr.ResampleStream(self._in_rate, MIC_RATE, 1, dtype="int16") if self._in_rate != MIC_RATE else None
        try:
            for s in streams:
                s.start()
            self._latency_s = float(latency())
            async with receive:
                async for block in receive:
                    if resampler is not None:
                        block = resampler.resample_chunk(block)
                    await on_mic(block.tobytes())
        finally:
            for s in streams:
                s.stop()
                s.close()
