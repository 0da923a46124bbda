"""The one interface both audio devices implement.

A device is duplex: every block it writes to the speaker it `pull`s from
its `PlaybackBuffer` (which keeps the playback cursor), and every block it
reads from the microphone (16 kHz mono int16) it hands to
`on_mic(mic, reference)` together with what it played meanwhile, resampled
to 16 kHz: the echo canceller's reference, tapped at write time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from voice.audio.playback import PlaybackBuffer

MIC_RATE = 16000
OnMic = Callable[[bytes, bytes], Awaitable[None]]


class AudioDevice(Protocol):
    buffer: PlaybackBuffer  # at the output rate

    @property
    def out_rate(self) -> int: ...

    def output_latency(self) -> int:
        """Samples between `pull` and the sound leaving the speaker."""
        ...

    async def run(self, on_mic: OnMic) -> None:
        """Stream until cancelled (live) or until the scenario is over (replay)."""
        ...

    def describe(self) -> str: ...
