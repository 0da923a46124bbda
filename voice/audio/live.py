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

The mic and the speaker are two streams, never one duplex stream. PortAudio's
duplex stream on ALSA waits for both sides in one loop; when the two run on
different clocks (on PipeWire: the mic's graph and the speaker's have
different quanta as soon as another program plays or records on one of them
at another latency, a level meter or a call at 10 ms) it fills every other
mic block with zeros, flagged `input underflow`, and that audio is gone.
Measured on the live tests' PipeWire with a 10 ms recorder on the speaker: a
3 s tone into the mic reached a duplex callback as 65,452 of 132,300
samples (94 of 189 blocks zero-filled); two streams got 131,222, the whole
tone. That was the request heard as "What's that?", or not at all, after
the devices changed (tests/live/test_live_mic_whole.py).
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

from voice.audio.device import MAX_MIC_BLOCK, MIC_RATE, AudioBack, AudioLost, MicMuted, OnAudio, OnMic, PinnedChange
from voice.audio.mic_mute import MuteWatch
from voice.audio.playback import PlaybackBuffer, silence
from voice.audio.silence_hold import SilenceHold
from voice.audio.stream_life import (
    CHECK_S,
    DEVICES_CHECK_S,
    Backoff,
    StreamWatch,
    audio_server_sockets,
    close_streams,
    forget_wedged,
    refresh_portaudio,
    server_changed_within,
    silence_c_stderr,
    sound_devices,
)


# The speaker's rate when there is no device to ask at start (PipeWire's own default
# graph rate); a device that appears later is opened at it (ALSA's default converts).
WAITING_OUT_RATE = 48000


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
    # No sound device at start (the audio server starts after us: systemd at login, a
    # socket-activated PipeWire): wait for one, as for a lost one, instead of failing.
    wait_for_audio: bool = False
    buffer: PlaybackBuffer = field(init=False)
    dropped_blocks: int = 0
    _latency_s: float = 0.0  # the stream's reported output latency: the fallback
    _last_block: tuple[float, float, int] | None = None  # (monotonic time, DAC delay s, frames) of the last output
    _in_rate: int = MIC_RATE
    _out_rate: int = MIC_RATE
    _names: tuple[str, str] = ("", "")
    # The streams' life (voice.audio.stream_life): reopening tries and losses, counted (the
    # watchdog is fed by them while the device is lost); the loss being recovered from;
    # streams that would not close.
    retries: int = 0
    _lost: dict | None = None
    _wedged: list = field(default_factory=list)
    _ever_opened: bool = False
    # Pinned devices that went away ("input", "output"): the system's default is used for each until
    # it is listed again (looked for when the sound devices change: voice.audio.stream_life.sound_devices).
    _gone: frozenset[str] = frozenset()
    _told_gone: frozenset[str] = frozenset()
    # Pinned devices listed but that would not open (busy: the audio server holds a card just plugged
    # in): the default meanwhile, until the sound devices or the audio server change.
    _unopenable: frozenset[str] = frozenset()
    _heard_to: int = 0  # the speaker position when the streams were closed for a change of devices
    _streaming: tuple | None = None  # (watch, tell) while the streams run: `reopen` loses them
    # A microphone that delivers exact zeros (a mute key: voice.audio.mic_mute), and since when (monotonic).
    _mute: MuteWatch = field(default_factory=MuteWatch)
    _muted_since: float | None = None

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
            self._query(sd)
        except (sd.PortAudioError, ValueError) as exc:  # no sound card, or no such device
            if self.wait_for_audio:
                self._wait_from_start(exc)
                return
            raise AudioUnavailable(
                f"no usable audio device ({exc}); list devices with `{sys.executable} -m sounddevice`, pick one with "
                "[audio] input/output in the config, or use `voice replay` on a headless machine"
            ) from None
        self.buffer = PlaybackBuffer(self._out_rate)

    def _wait_from_start(self, exc: Exception) -> None:
        """No device yet: the speaker will be opened at `WAITING_OUT_RATE`
        (the pipeline's rate is fixed before it runs), and `run` retries
        until one is there, with `audio_lost()` saying so meanwhile."""
        if not hasattr(self, "buffer"):
            self._out_rate = WAITING_OUT_RATE
            self._names = ("(none yet)", "(none yet)")
            self.buffer = PlaybackBuffer(self._out_rate)
        self._lost = {"since": time.monotonic(), "reason": f"no sound device yet: {exc}", "attempts": 0,
                      "error": None, "at_start": True}

    def _query(self, sd) -> None:
        """The devices' names and rates, from PortAudio's list. Once the
        playback buffer exists the speaker keeps its rate (the pipeline's):
        a reopened one is opened at it."""
        mic, speaker = self._in_use()
        ins = sd.query_devices(mic, "input")
        outs = sd.query_devices(speaker, "output")
        self._in_rate = int(ins["default_samplerate"])
        if not hasattr(self, "buffer"):
            self._out_rate = int(outs["default_samplerate"])
        self._names = (ins["name"], outs["name"])

    @property
    def out_rate(self) -> int:
        return self._out_rate

    def output_latency(self) -> int:
        """Samples handed to the device that have not left it yet, now."""
        return self._unplayed_at(time.monotonic())

    def describe(self) -> str:
        return f"mic {self._names[0]!r} @ {self._in_rate} Hz, speaker {self._names[1]!r} @ {self._out_rate} Hz"

    def audio_lost(self) -> dict | None:
        """While the sound card is lost: since when (monotonic), why, how
        many reopening tries, the last one's error. None while it streams."""
        return dict(self._lost) if self._lost is not None else None

    def mic_muted(self) -> float | None:
        """While the microphone delivers exact zeros: since when (monotonic)."""
        return self._muted_since

    async def run(self, on_mic: OnMic, on_audio: OnAudio | None = None) -> None:
        """Stream until cancelled. A lost stream (voice.audio.stream_life) is
        told to `on_audio` (`AudioLost`), closed, and reopened with back-off
        for as long as it takes; `AudioBack` once mic audio comes again."""
        import sounddevice as sd

        tell = on_audio or (lambda change: None)
        backoff = Backoff()
        silence_c_stderr()  # PortAudio's ALSA thread floods it while a server is dead (voice.audio.stream_life)
        if self._lost is not None:  # no device at start: told once, then waited for like a lost one
            tell(AudioLost(self._lost["reason"], 0, at_start=True))
        server = audio_server_sockets()
        while True:
            streams: list = []  # those opened so far: closed again whatever happens next
            watch = None
            try:
                try:
                    if self._lost is not None:  # PortAudio's device list as the system has it now (each try:
                        refresh_portaudio(sd, self._wedged)  # one made while the server was away is empty)
                    watch, receive, deliver = self._open(sd, streams, first=self._lost is None and not self._ever_opened)
                except (sd.PortAudioError, ValueError, AudioUnavailable) as exc:
                    if self._ever_opened and isinstance(exc, sd.PortAudioError):
                        self._unopenable = self._pinned_in_use()
                    if self._lost is None and self._ever_opened:  # reopened after the sound devices changed
                        self._lose(f"the audio devices changed and would not open again ({exc})", self._heard_to, tell)
                    if self._lost is None:
                        if not self.wait_for_audio or self._ever_opened:
                            raise
                        self._wait_from_start(exc)  # listed at start, but it would not open yet
                        tell(AudioLost(self._lost["reason"], 0, at_start=True))
                    self.retries += 1
                    self._lost["attempts"] += 1
                    self._lost["error"] = str(exc)
                    # the audio server's sockets coming (back) is worth a try at once, and quick ones after it
                    if await server_changed_within(backoff.next(), server):
                        backoff = Backoff()
                        self._unopenable = frozenset()  # a new server: a pinned device may open now
                    server = audio_server_sockets()
                    continue
                self._ever_opened = True
                self._tell_pinned(tell)
                await self._stream(watch, receive, deliver, on_mic, tell)
            finally:
                if watch is not None:
                    watch.closing = True
                with anyio.CancelScope(shield=True):
                    closed = await close_streams(streams, self._wedged, watch)
                if closed and watch is not None and watch.cancelled:
                    held = f"; {watch.locks_released} lock(s) they held let go" if watch.locks_released else ""
                    print(f"voice: the lost audio streams' stuck PortAudio threads were cancelled ({watch.cancelled}"
                          f"{held}), and the streams closed (a PortAudio 19.6 bug, PortAudio #1037)",
                          file=sys.stderr, flush=True)
                if not closed:
                    threads = [native for native, _ in watch.threads.values()] if watch is not None else []
                    forget_wedged(sd, streams, threads)
                    print("voice: warning: the lost audio stream cannot be closed (a PortAudio 19.6 bug, "
                          "PortAudio #1037): its thread is left at idle priority and PortAudio's messages are "
                          "silenced; restart the service to free it", file=sys.stderr, flush=True)
                self._last_block = None
                self._streaming = None
            if self._lost is None:  # not lost: the system's devices changed, and a pinned one may have come or gone
                refresh_portaudio(sd, self._wedged)
                continue
            # The streams are lost (a cancellation does not come here): reopen them.
            self.retries += 1
            backoff = Backoff()
            await anyio.sleep(backoff.next())

    def reopen(self, reason: str) -> None:
        """Lose the streams now, told as a loss with `reason`, and open them
        again at once: the computer woke from sleep (voice.agent.sleep_watch),
        after which they are often dead. Nothing pulls from the lost streams
        again, so the clear the loss asks of the playback buffer (a reply cut
        where its sound stopped) is done now (a pull of nothing), not at the
        reopened streams' first pull: what is queued after it (a timer ringing
        at resume) plays on them. While they are lost already, nothing: they
        are being reopened."""
        if self._streaming is None or self._lost is not None:
            return
        watch, tell = self._streaming
        now = time.monotonic()
        self._lose_streams(watch, reason, now, tell)
        self.buffer.pull(0)

    def _lose_streams(self, watch: StreamWatch, reason: str, stopped: float, tell) -> None:
        """The streams are lost, the sound having stopped at `stopped`: what
        was heard by then is kept, and the loss told once."""
        heard_to = watch.lose(reason, lambda: self.buffer.position - self._unplayed_at(stopped))
        self._lose(reason, heard_to, tell)

    async def _stream(self, watch: StreamWatch, receive, deliver, on_mic: OnMic, tell) -> None:
        """Hand mic blocks on until the streams are lost (told at once, before
        they are closed), or, with a device pinned, until the system's sound
        devices change (the pinned one may have gone or come back: the
        streams are reopened on what is there)."""
        self._streaming = (watch, tell)  # (until `run` has closed them)
        devices = sound_devices() if self._pinned() else None
        devices_checked = time.monotonic()
        async with receive:
            while watch.lost is None:  # (`reopen` loses them from outside)
                blocks = None
                with anyio.move_on_after(CHECK_S):
                    blocks = await receive.receive()
                if blocks is not None:
                    if self._lost is not None:  # mic audio again: the device is back
                        since = self._lost
                        self._lost = None
                        tell(AudioBack(self.describe(), time.monotonic() - since["since"], since["attempts"] + 1))
                    self._watch_mute(blocks, tell)
                    await deliver(blocks, on_mic)
                now = time.monotonic()
                found = watch.check(now)
                if found is not None:
                    self._lose_streams(watch, found[0], found[1], tell)
                    return
                if devices is not None and now - devices_checked >= DEVICES_CHECK_S:
                    devices_checked = now
                    if sound_devices() != devices:
                        # nothing more pulled: the reopened streams play on from where these stopped
                        self._heard_to = watch.lose("the sound devices changed",
                                                    lambda: self.buffer.position - self._unplayed_at(now))
                        self._unopenable = frozenset()
                        return

    def _lose(self, reason: str, heard_to: int, tell) -> None:
        """The streams are lost: said once (lost again before it was back is the same loss)."""
        if self._lost is None:
            self._lost = {"since": time.monotonic(), "reason": reason, "attempts": 0, "error": None, "at_start": False}
            tell(AudioLost(reason, heard_to))

    def _in_use(self) -> tuple[int | str | None, int | str | None]:
        """The devices to open: each the pinned one, or the default (None) while it is gone."""
        return (None if "input" in self._gone else self.input_device,
                None if "output" in self._gone else self.output_device)

    def _pinned(self) -> bool:
        return self.input_device is not None or self.output_device is not None

    def _pinned_in_use(self) -> frozenset[str]:
        pinned = (self.input_device, self.output_device)
        return frozenset(kind for kind, wanted, used in zip(("input", "output"), pinned, self._in_use())
                         if wanted is not None and used is not None)

    def _choose_devices(self, sd) -> None:
        """Each pinned device when PortAudio lists it (and it opened last
        time), else the system's default."""
        gone = set(self._unopenable)
        for kind, pinned in (("input", self.input_device), ("output", self.output_device)):
            if pinned is None:
                continue
            try:
                sd.query_devices(pinned, kind)
            except (sd.PortAudioError, ValueError):
                gone.add(kind)
        self._gone = frozenset(gone)

    def _tell_pinned(self, tell) -> None:
        """Once per change: a pinned device gone (the default in its place) or in use again."""
        if self._gone == self._told_gone:
            return
        changed = self._gone ^ self._told_gone
        self._told_gone = self._gone
        names = {"input": ("mic", self.input_device), "output": ("speaker", self.output_device)}
        pinned = " and ".join(f"{names[kind][0]} {names[kind][1]!r}" for kind in ("input", "output") if kind in changed)
        tell(PinnedChange(pinned, self.describe(), present=not (changed & self._gone)))

    def _watch_mute(self, blocks: list[np.ndarray], tell) -> None:
        """Told once when the mic has delivered only exact zeros for long (muted), and when it is not."""
        for block in blocks:
            change = self._mute.feed(block, self._in_rate)
            if change is not None:
                self._muted_since = time.monotonic() - change.silent_s if isinstance(change, MicMuted) else None
                tell(change)

    def _unplayed_at(self, t: float) -> int:
        """Samples handed to the device and not out of it at time `t`."""
        if self._last_block is None:  # no callback timing yet (or any more), or the host API gives none
            return round(self._latency_s * self._out_rate)
        called, delay, frames = self._last_block
        return unplayed(frames, delay, max(0.0, t - called), self._out_rate)

    def _open(self, sd, streams: list, *, first: bool):
        """Open and start the streams (into `streams` as each opens), with
        the callbacks of this opening; returns its watch, the mic blocks'
        receiving end and how to hand a list of them on."""
        loop = asyncio.get_running_loop()
        if not first:  # a reopening: the devices as the system has them now, at the speaker's rate
            self._choose_devices(sd)
            self._query(sd)
        send, receive = anyio.create_memory_object_stream[list[np.ndarray]](64)
        hold = (SilenceHold(self._in_rate, self._out_rate, floor_dbfs=self.hold_floor_dbfs,
                            quiet_s=self.hold_after_quiet_s, max_s=self.hold_silence_s)
                if self.hold_silence_s > 0 else None)
        watch = StreamWatch(self.block_ms / 1000, ("input", "output"))

        def put(block: list[np.ndarray]) -> None:
            try:
                send.send_nowait(block)
            except anyio.WouldBlock:
                self.dropped_blocks += 1  # the loop fell behind: drop mic audio, never block the callback
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # shutting down, or lost: the reader is gone

        played: deque[np.ndarray] = deque()  # the echo reference, appended at write time

        def on_output(outdata, frames, time_info, status) -> None:
            with watch.lock:
                if not watch.called("output", status):
                    outdata.fill(0)  # lost: the speaker position stays where the sound stopped
                    return
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
            if not watch.called("input", status):
                return
            block = indata[:, 0].copy()
            blocks = hold.take(block) if hold is not None else [block]
            if blocks:  # (none: held, silence while the service waits)
                loop.call_soon_threadsafe(put, blocks)

        resampler = soxr.ResampleStream(self._in_rate, MIC_RATE, 1, dtype="int16") if self._in_rate != MIC_RATE else None
        ref_resampler = (soxr.ResampleStream(self._out_rate, MIC_RATE, 1, dtype="int16")
                         if self._out_rate != MIC_RATE else None)

        async def deliver(blocks: list[np.ndarray], on_mic: OnMic) -> None:
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

        def returning(role: str, callback):
            def wrapped(*args) -> None:
                try:
                    callback(*args)
                finally:
                    watch.returned(role)  # (one stuck in PortAudio once it has returned may be cancelled)
            return wrapped

        try:
            latency = self._open_streams(sd, streams, returning("input", on_input), returning("output", on_output),
                                         watch.ended)
            for s in streams:
                s.start()
        except sd.PortAudioError as exc:  # listed, but it will not open: busy, or gone since the query
            if not first:
                raise
            raise AudioUnavailable(
                f"the audio device would not open (mic {self._names[0]!r}, speaker {self._names[1]!r}: {exc}); "
                f"close what else uses it, or list devices with `{sys.executable} -m sounddevice` and pick one "
                "with [audio] input/output in the config") from None
        self._latency_s = float(latency())
        return watch, receive, deliver

    def _open_streams(self, sd, streams: list, on_input, on_output, ended) -> Callable[[], float]:
        """Into `streams` as each opens: the mic's input stream, then the
        speaker's output stream (two streams: see the module's docstring).
        Returns how to read the output latency."""
        common = dict(channels=1, dtype="int16", finished_callback=ended)
        mic, speaker = self._in_use()
        streams.append(sd.InputStream(samplerate=self._in_rate, blocksize=self._in_rate * self.block_ms // 1000,
                                      device=mic, callback=on_input, **common))
        streams.append(sd.OutputStream(samplerate=self._out_rate, blocksize=self._out_rate * self.block_ms // 1000,
                                       device=speaker, callback=on_output, **common))
        return lambda: streams[1].latency


def unplayed(frames: int, dac_delay_s: float, since_s: float, rate: int) -> int:
    """Samples not yet out of the device, `since_s` after a callback handed it
    `frames` whose first sample PortAudio said would play `dac_delay_s` later."""
    return max(0, round(frames + (dac_delay_s - since_s) * rate))
