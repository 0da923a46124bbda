"""The one interface both audio devices implement.

A device is duplex: every block it writes to the speaker it `pull`s from
its `PlaybackBuffer` (which keeps the playback cursor), and every block it
reads from the microphone (16 kHz mono int16) it hands to
`on_mic(mic, reference)` together with what it played meanwhile, resampled
to 16 kHz: the echo canceller's reference, tapped at write time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from voice.audio.playback import PlaybackBuffer

MIC_RATE = 16000
# The longest mic block a device hands on, in samples at MIC_RATE (2 s). A sound card
# delivers tens of milliseconds at a time, but silence held back while the service
# waits (voice.audio.silence_hold) comes on as one block: up to a second of it joined
# with the block that ended it. Recordings keep blocks as delivered (mic_blocks.txt)
# and the scenario loader accepts exactly these: this is the one definition of both.
MAX_MIC_BLOCK = 2 * MIC_RATE
OnMic = Callable[[bytes, bytes], Awaitable[None]]


@dataclass(frozen=True)
class AudioLost:
    """The sound card went away (the audio server died, the headset was
    unplugged): nothing is heard or played until `AudioBack`."""

    reason: str  # the error, or the stall, in words
    heard_to: int  # speaker position: what was handed over before it was heard out of the speaker
    at_start: bool = False  # there was no sound device to begin with: it is waited for


@dataclass(frozen=True)
class AudioBack:
    """The device is streaming again, after `after_s` and `attempts` tries."""

    devices: str  # describe() of what is in use now
    after_s: float
    attempts: int


@dataclass(frozen=True)
class PinnedChange:
    """A device pinned in the config (`[audio] input`/`output`) went away
    and the system's default devices are used instead (`present` False), or
    it is there again and in use (`present` True)."""

    pinned: str  # the pinned devices, as the config names them
    devices: str  # describe() of what is in use now
    present: bool


@dataclass(frozen=True)
class MicMuted:
    """The microphone has delivered nothing but exact digital zeros for
    `silent_s` (a mute key: voice.audio.mic_mute): nothing can be heard until
    `MicUnmuted`. The stream runs on: it is not lost."""

    silent_s: float


@dataclass(frozen=True)
class MicUnmuted:
    """Sound from the microphone again, after `muted_s` of exact zeros."""

    muted_s: float


AudioChange = AudioLost | AudioBack | PinnedChange | MicMuted | MicUnmuted
# Told (on the event loop) when the audio comes and goes (a replay's sound card is lost only where its scenario says).
OnAudio = Callable[[AudioChange], None]


class AudioDevice(Protocol):
    buffer: PlaybackBuffer  # at the output rate
    retries: int  # times it has tried to reopen a lost sound card (the watchdog: still trying is alive)

    @property
    def out_rate(self) -> int: ...

    def output_latency(self) -> int:
        """Samples between `pull` and the sound leaving the speaker."""
        ...

    async def run(self, on_mic: OnMic, on_audio: OnAudio | None = None) -> None:
        """Stream until cancelled (live) or until the scenario is over
        (replay); a live device that loses its sound card says so to
        `on_audio` and reopens it."""
        ...

    def describe(self) -> str: ...

    def reopen(self, reason: str) -> None:
        """Close the streams and open them again at once, told to `on_audio`
        as a loss with `reason` and a return (the computer woke from sleep:
        a sound card's streams are often dead after it)."""
        ...

    def audio_lost(self) -> dict | None:
        """While the sound card is lost: {since (monotonic), reason,
        attempts, error (the last try's), at_start (there was none to begin
        with)}; None while it streams."""
        ...

    def mic_muted(self) -> float | None:
        """While the microphone delivers exact zeros (muted, `MicMuted`
        told): since when (monotonic); else None."""
        ...
