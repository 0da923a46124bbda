"""The replay device: a duplex device backed by WAV files on a virtual clock.

Each tick reads one 20 ms mic block from the scenario (or one of the sizes a
recording's device delivered) and writes one speaker block pulled from the
playback buffer, exactly as the sounddevice callback
does, so `played` holds precisely the samples the speaker played, on the
same sample clock as `mic`. Output latency is zero by construction.

User clips are placed on that clock as the scenario says; a barge-in clip
is placed so that its speech onset (first loud sample) falls exactly
`barge_in_after` seconds after the previous reply's first played sample.

A scenario's `[[audio_lost]]` is the sound card going away at a second of
the scenario's clock (or a given time into the next reply to begin playing,
which does not depend on how fast the reply came) and coming back
`back_after` seconds later, told to
the session exactly as the live device tells it (`AudioLost`, `AudioBack`):
meanwhile nothing is heard or played, and the scenario's clock (the mic's
samples) stands still while the session's clock goes on.

With an `[echo]` path, what the speaker played returns into the mic:
delayed, attenuated, optionally reverberated (an exponentially decaying
noise tail with the given RT60) and with a noise floor, as laptop speakers
and a built-in microphone would.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import anyio
import numpy as np

from voice.audio.device import MIC_RATE, AudioBack, AudioLost, OnAudio, OnMic
from voice.audio.playback import PlaybackBuffer

BLOCK = MIC_RATE // 50  # 20 ms


@dataclass(frozen=True)
class UserClip:
    audio: np.ndarray  # int16 16 kHz
    name: str
    when: str  # "at" | "barge_in_after" | "after_reply" | "after_idle"
    seconds: float
    onset: int  # samples from the clip start to the first loud sample

    @property
    def duration(self) -> float:
        return len(self.audio) / MIC_RATE


@dataclass(frozen=True)
class AudioLoss:
    """The sound card goes at `at_s` (the scenario's clock), or `into_reply_s`
    after the first sample of the next reply to begin playing (after the
    previous loss), for `back_after_s` (the session's clock)."""

    at_s: float | None
    back_after_s: float
    into_reply_s: float | None = None


@dataclass(frozen=True)
class EchoPath:
    delay_ms: float = 60.0
    gain_db: float = -10.0
    reverb_s: float = 0.0
    noise_db: float = -90.0


class ReplayScript(Protocol):
    """What the device plays: a scenario (voice.service.scenario) as the audio layer sees it."""

    path: Path
    users: tuple[UserClip, ...]
    echo: EchoPath | None
    tail: float
    max_duration: float
    blocks: tuple[int, ...]  # mic block sizes to tick with (a recording's); past them, BLOCK
    losses: tuple[AudioLoss, ...]  # the sound card going and coming back, in order


@dataclass
class PlacedClip:
    clip: UserClip
    start: int  # mic sample position of the clip's first sample

    @property
    def onset(self) -> int:
        return self.start + self.clip.onset

    @property
    def end(self) -> int:
        return self.start + len(self.clip.audio)


#: Tick lateness figures kept when the device does not record (the newest: 60 s).
KEEP_TICKS = 3000
#: A barge-in clip whose previous clip got no reply at all waits this long in
#: silence, then is said anyway (as a request): a long soak never stalls on a
#: request the recogniser heard as nothing.
NOTHING_TO_CUT_S = 2.0


@dataclass
class ReplayDevice:
    """`record` (default: unless `hold`): keep the whole session in memory
    (mic and played audio, every tick's lateness, every playback mark), for
    tests that read it afterwards. Without it the device keeps bounded recent
    figures only, so a replay of any length (the daemon's, a soak) runs in
    flat memory. `summarize` (default: `record`): also keep what a replay's
    summary reads, in memory that grows with the scenario, not with time:
    every clip placed (the scenario holds them all anyway) and the ticks'
    lateness as counts per 0.1 ms. `voice replay` summarizes without
    recording: its sound goes to disk as it comes (the session's recorder)."""

    scenario: ReplayScript
    idle: Callable[[], bool]  # True when the assistant has nothing to do or say
    buffer: PlaybackBuffer | None = None
    realtime: bool = False
    hold: bool = False  # after the scenario, keep listening to silence until cancelled (the daemon)
    record: bool | None = None
    summarize: bool | None = None
    position: int = 0
    retries: int = 0  # (AudioDevice: reopening tries; a replay's lost card comes back when its scenario says)
    placed: list[PlacedClip] = field(default_factory=list)  # without `summarize`, from the one still heard on
    clips_placed: int = 0  # of the scenario's users, in order
    mic_blocks: list[np.ndarray] = field(default_factory=list)
    played_blocks: list[np.ndarray] = field(default_factory=list)
    tick_lateness: deque[float] = field(init=False)
    lateness_counts: Counter[float] = field(default_factory=Counter)  # ms (to 0.1) -> ticks, with `summarize`
    gave_up: str | None = None
    losses_not_reached: list[str] = field(default_factory=list)  # [[audio_lost]] the scenario ended before
    _echo: "_EchoPath | None" = None
    _audible_from: int = 0  # placed clips before this one have ended: mixing skips them
    _quiet_since: int | None = None  # idle since this position, the previous clip over (NOTHING_TO_CUT_S)
    _lost: dict | None = None  # audio_lost() while a scenario's loss lasts

    def __post_init__(self) -> None:
        if self.record is None:
            self.record = not self.hold
        if self.summarize is None:
            self.summarize = self.record
        if self.buffer is None:
            self.buffer = PlaybackBuffer(MIC_RATE, keep=None) if self.record else PlaybackBuffer(MIC_RATE)
        self.tick_lateness = deque(maxlen=None if self.record else KEEP_TICKS)
        if self.scenario.echo is not None:
            self._echo = _EchoPath(self.scenario.echo)

    @property
    def out_rate(self) -> int:
        return MIC_RATE

    def output_latency(self) -> int:
        return 0

    def audio_lost(self) -> dict | None:
        return None if self._lost is None else dict(self._lost)

    def reopen(self, reason: str) -> None:
        pass  # a scenario's sound card has no streams to lose in a sleep

    def mic_muted(self) -> None:
        return None  # a scenario's microphone is never muted: its silence between clips is made of exact zeros

    def describe(self) -> str:
        return f"replay of {self.scenario.path.name} ({'real time' if self.realtime else 'virtual clock'})"

    def mic(self) -> np.ndarray:
        return np.concatenate(self.mic_blocks) if self.mic_blocks else np.zeros(0, np.int16)

    def played(self) -> np.ndarray:
        return np.concatenate(self.played_blocks) if self.played_blocks else np.zeros(0, np.int16)

    def lateness_p99_ms(self) -> float:
        """The 99th percentile of every tick's lateness (`summarize`), in ms
        to 0.1: the figure a sorted list of them gives, since rounding keeps
        their order."""
        rank = int(0.99 * (sum(self.lateness_counts.values()) - 1))
        for ms in sorted(self.lateness_counts):
            rank -= self.lateness_counts[ms]
            if rank < 0:
                return ms
        return 0.0

    async def run(self, on_mic: OnMic, on_audio: OnAudio | None = None) -> None:
        limit = int(self.scenario.max_duration * MIC_RATE)
        tail = int(self.scenario.tail * MIC_RATE)
        losses = deque(self.scenario.losses)
        since_loss = 0  # where the last loss ended: an `into_reply` loss waits for a reply begun after it
        idle_since: int | None = None
        deadline = time.monotonic()
        ticks = 0
        while self.hold or self.position < limit:
            if losses and self._loss_due(losses[0], since_loss):
                await self._lose(losses.popleft(), on_audio)
                since_loss = self.position
                deadline = time.monotonic()
            self._place_next()
            n = self.scenario.blocks[ticks] if ticks < len(self.scenario.blocks) else BLOCK
            ticks += 1
            played = self.buffer.pull(n)  # what the speaker plays during this block
            mic = self._mix(self.position, n)
            if self._echo is not None:
                mic = self._echo.add(played, mic)
            await on_mic(mic.tobytes(), played.tobytes())
            if self.record:  # a daemon may run for days: keep no recording
                self.played_blocks.append(played)
                self.mic_blocks.append(mic)
            self.position += n
            if self.clips_placed == len(self.scenario.users) and self.position >= self.placed[-1].end:
                if self.idle():
                    idle_since = self.position if idle_since is None else idle_since
                    if self.position - idle_since >= tail and not self.hold:
                        self._not_reached(losses, since_loss)
                        return
                else:
                    idle_since = None
            deadline += n / MIC_RATE
            late = max(0.0, time.monotonic() - deadline)
            self.tick_lateness.append(late)
            if self.summarize:
                self.lateness_counts[round(late * 1000, 1)] += 1
            await anyio.sleep_until(deadline)
        self.gave_up = f"the scenario reached max_duration = {self.scenario.max_duration} s"
        self._not_reached(losses, since_loss)

    def _not_reached(self, losses: deque[AudioLoss], since: int) -> None:
        """Say which losses never came: the scenario ended first."""
        ended = f"the scenario ended at {self.position / MIC_RATE:g} s"
        for loss in losses:
            if loss.at_s is not None:
                self.losses_not_reached.append(f"[[audio_lost]] at = {loss.at_s:g} never came: {ended}")
                continue
            began = self._reply_began(since)
            self.losses_not_reached.append(
                f"[[audio_lost]] into_reply = {loss.into_reply_s:g} never came: {ended}, "
                + ("before a reply began to play" if began is None else
                   f"{(self.position - began) / MIC_RATE:g} s into the reply it waited for"))
        losses.clear()

    def _loss_due(self, loss: AudioLoss, since: int) -> bool:
        if loss.at_s is not None:
            return self.position >= loss.at_s * MIC_RATE
        began = self._reply_began(since)
        return began is not None and self.position >= began + loss.into_reply_s * MIC_RATE

    def _reply_began(self, since: int) -> int | None:
        """Where the first reply to begin playing at or after `since` began (the speaker's clock is the mic's)."""
        return next((s for s in self.buffer.starts if s >= since), None)

    async def _lose(self, loss: AudioLoss, on_audio: OnAudio | None) -> None:
        """A scenario's `[[audio_lost]]`: told as the live device tells it;
        nothing is heard or pulled until it is back."""
        reason = f"the scenario's sound card went at {self.position / MIC_RATE:g} s"
        self._lost = {"since": time.monotonic(), "reason": reason, "attempts": 0, "error": None, "at_start": False}
        if on_audio is not None:  # (no output latency: what was pulled has come out of the speaker)
            on_audio(AudioLost(reason=reason, heard_to=self.buffer.position))
        back_at = anyio.current_time() + loss.back_after_s
        while (left := back_at - anyio.current_time()) > 0:  # "reopening" twice a second, as the watchdog expects
            await anyio.sleep(min(left, 0.5))
            self.retries += 1
            self._lost["attempts"] += 1
        attempts = self._lost["attempts"]
        self._lost = None
        if on_audio is not None:
            on_audio(AudioBack(devices=self.describe(), after_s=loss.back_after_s, attempts=attempts))

    def _place_next(self) -> None:
        n = self.clips_placed
        if n == len(self.scenario.users):
            return
        clip = self.scenario.users[n]
        seconds = int(clip.seconds * MIC_RATE)
        if clip.when == "at":
            self._place(clip, seconds)
            return
        previous = self.placed[-1]
        if self.position < previous.end:
            return
        if clip.when == "after_idle":  # whether or not anything answered the previous clip
            if self.idle():
                self._place(clip, self.position + seconds)
            return
        reply_start = next((s for s in self.buffer.starts if s >= previous.onset), None)
        if not self.idle():
            self._quiet_since = None
        elif self._quiet_since is None or self._quiet_since < previous.end:
            self._quiet_since = self.position
        if reply_start is None:
            if (clip.when == "barge_in_after" and self._quiet_since is not None
                    and self.position - self._quiet_since >= NOTHING_TO_CUT_S * MIC_RATE):
                # Nothing answered the previous clip: there is no reply to talk over, and
                # waiting for one would end the scenario. It is said as the next request.
                self._place(clip, self.position)
            return  # the reply has not started playing yet
        if clip.when == "barge_in_after":
            self._place(clip, reply_start + seconds - clip.onset)
        elif self.idle():  # after_reply
            self._place(clip, self.position + seconds)

    def _place(self, clip: UserClip, start: int) -> None:
        self.placed.append(PlacedClip(clip, start))
        self.clips_placed += 1

    def _mix(self, start: int, n: int) -> np.ndarray:
        out = np.zeros(n, np.int32)
        while self._audible_from < len(self.placed) and self.placed[self._audible_from].end <= start:
            self._audible_from += 1  # (clips are placed in order: a tick's cost stays flat)
        if not self.summarize and self._audible_from > 1:  # a soak, a daemon: forget clips heard out (not the last)
            del self.placed[: self._audible_from - 1]
            self._audible_from = 1
        for p in self.placed[self._audible_from:]:
            lo, hi = max(start, p.start), min(start + n, p.end)
            if lo < hi:
                out[lo - start : hi - start] += p.clip.audio[lo - p.start : hi - p.start]
        return np.clip(out, -32768, 32767).astype(np.int16)


class _EchoPath:
    """Speaker -> room -> mic, block by block (a causal FIR on the played signal)."""

    def __init__(self, spec: EchoPath, seed: int = 1):
        rng = np.random.default_rng(seed)
        delay = int(spec.delay_ms * MIC_RATE / 1000)
        gain = 10 ** (spec.gain_db / 20)
        tail = int(spec.reverb_s * MIC_RATE)
        ir = np.zeros(delay + max(tail, 1))
        ir[delay] = 1.0
        if tail:  # a decaying noise tail (RT60 = reverb_s) carrying half the direct path's energy
            t = np.arange(1, tail) / MIC_RATE
            decay = rng.standard_normal(tail - 1) * np.exp(-6.9 * t / spec.reverb_s)
            ir[delay + 1 : delay + tail] = decay * np.sqrt(0.5 / np.sum(decay**2))
        self.ir = gain * ir
        self.history = np.zeros(len(self.ir) - 1)
        self.noise = 32768 * 10 ** (spec.noise_db / 20)
        self.rng = rng

    def add(self, played: np.ndarray, mic: np.ndarray) -> np.ndarray:
        x = np.concatenate([self.history, played.astype(np.float64)])
        echo = np.convolve(x, self.ir, mode="valid")
        self.history = x[len(played):]
        out = mic.astype(np.float64) + echo + self.noise * self.rng.standard_normal(len(mic))
        return np.clip(out, -32768, 32767).astype(np.int16)
