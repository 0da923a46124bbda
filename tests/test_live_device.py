"""LiveDevice against a fake `sounddevice` module: the fake streams call the
callback from a thread, block after block, on a fake clock (no real audio,
no real waiting beyond tiny yields)."""

from __future__ import annotations

import sys
import threading
import time
import types
from dataclasses import dataclass, field

import anyio
import numpy as np
import pytest

from voice.audio.live import AudioUnavailable, LiveDevice
from voice.audio.playback import PlaybackBuffer


@dataclass
class FakeTime:
    inputBufferAdcTime: float
    outputBufferDacTime: float
    currentTime: float


class FakePortAudioError(Exception):
    """As sounddevice.PortAudioError: raised when PortAudio cannot do it."""


class FakeSD:
    """What LiveDevice uses of sounddevice: query_devices, three stream
    classes, and PortAudio's re-initialisation (counted). Every stream runs
    `blocks` callbacks then stops calling (`blocks` a list: the n-th stream
    of its kind runs the n-th count, the last for any after it); with
    `ends`, it then ends on its own (PortAudio's finished callback, as
    after an error). `status(i)` gives block i's status flags. `wedged`:
    a stopped stream's stop() never returns (PortAudio #1037) until the
    test sets `unwedge`. `open_errors`: that many openings fail (the audio
    server is still gone)."""

    def __init__(
        self,
        in_rate: float = 16000.0,
        out_rate: float = 16000.0,
        *,
        blocks: int | list[int] = 40,
        out_latency: float = 0.05,
        query_error: Exception | None = None,
        mic=None,
        ends: bool = False,
        status=None,
        wedged: bool = False,
        open_errors: int = 0,
    ):
        self.in_rate, self.out_rate = in_rate, out_rate
        self.mic = mic or mic_block  # (block index, frames) -> that block's mic samples
        self.blocks = blocks
        self.out_latency = out_latency
        self.query_error = query_error
        self.ends = ends
        self.status = status or (lambda i: None)
        self.wedged = wedged
        self.unwedge = threading.Event()
        self.open_errors = open_errors
        self.failed_opens = 0
        self.terminated = self.initialized = 0
        self.queries: list[tuple] = []
        self.streams: list[FakeStream] = []
        #: block index -> Event the stream thread waits for before that block
        self.gates: dict[int, threading.Event] = {}
        sd = self

        class Stream(FakeStream):
            def __init__(self, **kw):
                super().__init__(sd, kind="duplex", **kw)

        class InputStream(FakeStream):
            def __init__(self, **kw):
                super().__init__(sd, kind="input", **kw)

        class OutputStream(FakeStream):
            def __init__(self, **kw):
                super().__init__(sd, kind="output", **kw)

        self.module = types.ModuleType("sounddevice")
        self.module.PortAudioError = FakePortAudioError
        self.module.query_devices = self.query_devices
        self.module.Stream = Stream
        self.module.InputStream = InputStream
        self.module.OutputStream = OutputStream
        self.module._initialized = 1
        self.module._last_callback = None
        self.module._terminate = self._terminate
        self.module._initialize = self._initialize

    def _terminate(self) -> None:
        assert not [s for s in self.streams if not s.closed], "PortAudio terminated with a stream open"
        self.terminated += 1

    def _initialize(self) -> None:
        self.initialized += 1

    def blocks_of(self, kind: str) -> int:
        if isinstance(self.blocks, int):
            return self.blocks
        n = sum(1 for s in self.streams if s.kind == kind) - 1
        return self.blocks[min(n, len(self.blocks) - 1)]

    def of_kind(self, kind: str) -> list[FakeStream]:
        return [s for s in self.streams if s.kind == kind]

    def query_devices(self, device=None, kind=None):
        self.queries.append((device, kind))
        if self.query_error is not None:
            raise self.query_error
        rate = self.in_rate if kind == "input" else self.out_rate
        return {"name": f"fake {kind} {device}", "default_samplerate": rate}

    def stream(self, kind: str) -> FakeStream:
        [s] = [s for s in self.streams if s.kind == kind]
        return s

    def opening(self) -> None:
        """A stream is being made: fails while the server is gone."""
        if self.failed_opens < self.open_errors:
            self.failed_opens += 1
            raise FakePortAudioError("Error opening Stream: Device unavailable [PaErrorCode -9985]")


def mic_block(index: int, frames: int) -> np.ndarray:
    """Distinct, known mic samples for block `index`."""
    return (np.arange(frames, dtype=np.int32) + index * frames) % 30000 + 1


@dataclass
class FakeStream:
    sd: FakeSD
    samplerate: int
    blocksize: int
    device: object
    callback: object
    channels: int
    dtype: str
    finished_callback: object = None
    kind: str = "?"
    started: bool = False
    stopped: bool = False
    closed: bool = False
    calls: int = 0
    last_call: float = 0.0  # monotonic
    outputs: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    finished: threading.Event = field(default_factory=threading.Event)
    errors: list = field(default_factory=list)
    _halt: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.sd.opening()
        self.sd.streams.append(self)
        self.blocks = self.sd.blocks_of(self.kind)

    @property
    def latency(self):
        if self.kind == "duplex":
            return (0.01, self.sd.out_latency)
        if self.kind == "output":
            return self.sd.out_latency
        return 0.01

    def start(self) -> None:
        assert not self.started
        self.started = True
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        frames = self.blocksize
        ended = False
        try:
            for i in range(self.blocks):
                gate = self.sd.gates.get(i)
                if gate is not None and not gate.wait(timeout=5):
                    raise TimeoutError(f"gate {i} never opened")
                if self._halt.is_set():
                    break
                self._keep_step(i)
                t = i * frames / self.samplerate  # the fake clock
                info = FakeTime(t, t + 0.05, t)
                indata = self.sd.mic(i, frames).astype(np.int16).reshape(frames, 1)
                outdata = np.full((frames, 1), -12345, dtype=np.int16)  # garbage, as a real device gives
                status = self.sd.status(i)
                if self.kind == "duplex":
                    self.callback(indata, outdata, frames, info, status)
                elif self.kind == "input":
                    self.callback(indata, frames, info, status)
                else:
                    self.callback(outdata, frames, info, status)
                if self.kind != "output":
                    self.inputs.append(indata[:, 0].copy())
                if self.kind != "input":
                    self.outputs.append(outdata.copy())
                self.calls += 1
                self.last_call = time.monotonic()
                time.sleep(0.0005)  # a tiny yield, not real time
            ended = self.sd.ends and not self._halt.is_set()
        except BaseException as exc:  # surfaced by the tests
            self.errors.append(exc)
        finally:
            self.finished.set()
        if ended and self.finished_callback is not None:
            self.finished_callback()

    def _keep_step(self, i: int) -> None:
        """Block `i` of the mic's stream waits until the speaker's stream of
        the same opening has been handed its block `i` (sound goes to the
        device before its echo can be captured), and the speaker's block `i`
        until the mic's `i - 1` is in: the two alternate, as two real
        streams on one clock keep step (free-running threads drift apart by
        many blocks). Not once the other has ended, and for at most 0.5 s."""
        mine = self.sd.streams.index(self)
        if self.kind == "input":
            partner, needed = next((s for s in self.sd.streams[mine + 1:] if s.kind == "output"), None), i + 1
        else:
            partner, needed = next((s for s in reversed(self.sd.streams[:mine]) if s.kind == "input"), None), i
        deadline = time.monotonic() + 0.5
        while (partner is not None and partner.calls < needed and not partner.finished.is_set()
               and not self._halt.is_set() and time.monotonic() < deadline):
            time.sleep(0.0002)

    def stop(self) -> None:
        self.stopped = True
        self._halt.set()
        for g in self.sd.gates.values():
            g.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.sd.wedged:  # PortAudio's callback thread never ends: neither does its stop
            self.wedge_waits = True
            self.sd.unwedge.wait(30)

    def abort(self) -> None:
        self.stop()  # (PortAudio's abort cancels the callback thread; it waits for it as a stop does)

    def close(self) -> None:
        assert self.stopped, "closed before stopped"
        self.closed = True


@pytest.fixture
def fake_sd(monkeypatch):
    import voice.audio.live as live

    def install(*args, **kw) -> FakeSD:
        sd = FakeSD(*args, **kw)
        monkeypatch.setitem(sys.modules, "sounddevice", sd.module)
        monkeypatch.setattr(live, "silence_c_stderr", lambda: None)  # (this test process's C stderr stays)
        return sd

    return install


async def run_until(device: LiveDevice, sd: FakeSD, on_mic, condition, *, timeout: float = 5.0) -> None:
    """Run the device in a task group, wait for `condition()`, cancel it."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(device.run, on_mic)
        with anyio.fail_after(timeout):
            while not condition():
                await anyio.sleep(0.002)
        tg.cancel_scope.cancel()


def all_streams_done(sd: FakeSD) -> bool:
    return bool(sd.streams) and all(s.finished.is_set() for s in sd.streams)


# -- construction ----------------------------------------------------------------


def test_construct_reads_device_rates(fake_sd):
    sd = fake_sd(48000.0, 16000.0)
    dev = LiveDevice(input_device=3, output_device="speakers")
    assert sd.queries == [(3, "input"), ("speakers", "output")]
    assert dev.out_rate == 16000
    assert isinstance(dev.buffer, PlaybackBuffer)
    assert dev.buffer.rate == 16000
    assert dev.output_latency() == 0  # not known before the stream runs
    assert dev.describe() == "mic 'fake input 3' @ 48000 Hz, speaker 'fake output speakers' @ 16000 Hz"


def test_no_sound_card_raises_audio_unavailable_with_the_fix(fake_sd):
    # What the real sounddevice raises on a machine without a sound card.
    fake_sd(query_error=FakePortAudioError("Error querying device -1"))
    with pytest.raises(AudioUnavailable) as info:
        LiveDevice()
    msg = str(info.value)
    assert "Error querying device -1" in msg
    assert "python -m sounddevice" in msg
    assert "[audio]" in msg
    assert "voice replay" in msg
    assert info.value.__cause__ is None


def test_no_sound_card_at_start_is_waited_for_when_asked(fake_sd):
    # `voice run` on the default devices before the audio server is up (#36.5)
    fake_sd(query_error=FakePortAudioError("Error querying device -1"))
    dev = LiveDevice(wait_for_audio=True)
    lost = dev.audio_lost()
    assert lost is not None and lost["at_start"] and lost["attempts"] == 0, lost
    assert "Error querying device -1" in lost["reason"]
    assert dev.out_rate == 48000 and dev.buffer.rate == 48000  # the rate it will open a device at
    assert "none yet" in dev.describe()


def test_unknown_device_raises_audio_unavailable(fake_sd):
    fake_sd(query_error=ValueError("No input device matching 'nope'"))
    with pytest.raises(AudioUnavailable, match="voice replay") as info:
        LiveDevice(input_device="nope")
    assert "No input device matching 'nope'" in str(info.value)


# -- the mic and the speaker at 16 kHz: two streams (voice.audio.live) -------------


@pytest.mark.anyio
async def test_the_output_is_exactly_what_the_buffer_pulls_and_the_mic_comes_whole(fake_sd):
    sd = fake_sd(16000.0, 16000.0, blocks=40)
    dev = LiveDevice()
    rng = np.random.default_rng(7)
    speech = [rng.integers(-20000, 20000, size=n, dtype=np.int16) for n in (1000, 2500, 777)]
    reference = PlaybackBuffer(16000)
    for i, s in enumerate(speech):
        dev.buffer.enqueue(i, s)
        reference.enqueue(i, s)
    mic: list[bytes] = []
    echo_reference: list[bytes] = []

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        mic.append(data)
        echo_reference.append(reference)

    await run_until(dev, sd, on_mic, lambda: all_streams_done(sd) and len(mic) == 40)
    assert [s.kind for s in sd.streams] == ["input", "output"]  # never one duplex stream
    inp, stream = sd.stream("input"), sd.stream("output")
    for s in (inp, stream):
        assert not s.errors
        assert (s.samplerate, s.blocksize, s.channels, s.dtype) == (16000, 320, 1, "int16")
        assert s.device is None
        assert s.started and s.stopped and s.closed
        assert s.calls == 40

    assert all(o.shape == (320, 1) and o.dtype == np.int16 for o in stream.outputs)
    out = np.concatenate([o[:, 0] for o in stream.outputs])
    expected = np.concatenate([reference.pull(320) for _ in range(40)])
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(out[:4277], np.concatenate(speech))
    assert not out[4277:].any()
    # the echo canceller's reference is exactly what was handed to the device, in order, nothing skipped or
    # repeated: each mic block comes with what the speaker was handed since the block before (the last
    # blocks handed after the last mic block wait for the next one)
    ref = np.frombuffer(b"".join(echo_reference), np.int16)
    assert len(ref) and all(len(r) % 640 == 0 for r in echo_reference)
    np.testing.assert_array_equal(ref, out[:len(ref)])
    assert dev.buffer.position == 40 * 320
    assert dev.buffer.starts == [0, 1000, 3500]

    # Mic: 16 kHz int16 bytes, block by block, unchanged.
    assert [len(b) for b in mic] == [640] * 40
    got = np.frombuffer(b"".join(mic), dtype=np.int16)
    np.testing.assert_array_equal(got, np.concatenate(inp.inputs))
    np.testing.assert_array_equal(got[:320], mic_block(0, 320).astype(np.int16))
    assert dev.dropped_blocks == 0

    # Latency: the output stream's output latency, in output samples.
    assert dev.output_latency() == round(0.05 * 16000) == 800


@pytest.mark.anyio
async def test_a_requested_clear_takes_effect_in_the_next_callback(fake_sd):
    sd = fake_sd(16000.0, 16000.0, blocks=20)
    resume = threading.Event()
    sd.gates[5] = resume  # the stream thread stops before block 5 until we say so
    dev = LiveDevice()
    speech = np.arange(1, 10001, dtype=np.int16)  # 10000 non-zero samples: would last 31 blocks
    dev.buffer.enqueue("s", speech)

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(dev.run, on_mic)
        with anyio.fail_after(5):
            while not sd.of_kind("output") or sd.stream("output").calls < 5:
                await anyio.sleep(0.002)
        dev.buffer.request_clear()  # from the event loop, as VoiceSurface.stop does
        resume.set()
        with anyio.fail_after(5):
            while not all_streams_done(sd):
                await anyio.sleep(0.002)
        tg.cancel_scope.cancel()

    stream = sd.stream("output")
    assert not stream.errors
    assert stream.calls == 20
    out = np.concatenate([o[:, 0] for o in stream.outputs])
    np.testing.assert_array_equal(out[:1600], speech[:1600])
    assert not out[1600:].any(), "a sample of the cleared chunk was played after the clear"
    assert dev.buffer.clears == [1600]
    assert dev.buffer.handed("s") == 1600
    assert stream.stopped and stream.closed


# -- separate input and output streams ---------------------------------------------------


@pytest.mark.anyio
async def test_48k_mic_is_resampled_to_16k_and_output_latency_comes_from_the_output_stream(fake_sd):
    sd = fake_sd(48000.0, 16000.0, blocks=30)
    dev = LiveDevice(input_device=1, output_device=2)
    speech = np.arange(1, 2001, dtype=np.int16)
    dev.buffer.enqueue("s", speech)
    mic: list[bytes] = []

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        assert isinstance(data, bytes)
        mic.append(data)

    await run_until(dev, sd, on_mic, lambda: all_streams_done(sd) and len(mic) == 30)
    assert sorted(s.kind for s in sd.streams) == ["input", "output"]
    inp, outp = sd.stream("input"), sd.stream("output")
    assert not inp.errors and not outp.errors
    assert (inp.samplerate, inp.blocksize, inp.device) == (48000, 960, 1)
    assert (outp.samplerate, outp.blocksize, outp.device) == (16000, 320, 2)
    for s in (inp, outp):
        assert (s.channels, s.dtype) == (1, "int16")
        assert s.started and s.stopped and s.closed
    assert inp.calls == outp.calls == 30

    out = np.concatenate([o[:, 0] for o in outp.outputs])
    np.testing.assert_array_equal(out[:2000], speech)
    assert not out[2000:].any()

    total = sum(len(b) for b in mic) // 2
    assert all(len(b) % 2 == 0 for b in mic)
    assert abs(total - 960 * 30 / 3) <= 320, total  # within one 16 kHz block (the resampler's delay)
    assert total < 960 * 30  # really resampled, not passed through
    assert dev.dropped_blocks == 0
    assert dev.output_latency() == round(0.05 * 16000) == 800


@pytest.mark.anyio
async def test_both_at_48k_the_mic_is_resampled_and_latency_is_reported_at_48k(fake_sd):
    sd = fake_sd(48000.0, 48000.0, blocks=30)
    dev = LiveDevice()
    mic: list[bytes] = []

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        mic.append(data)

    await run_until(dev, sd, on_mic, lambda: all_streams_done(sd) and len(mic) == 30)
    assert [s.kind for s in sd.streams] == ["input", "output"]
    for stream in sd.streams:
        assert (stream.samplerate, stream.blocksize) == (48000, 960)
        assert not stream.errors
        assert stream.stopped and stream.closed
    total = sum(len(b) for b in mic) // 2
    assert abs(total - 960 * 30 / 3) <= 320, total
    assert dev.output_latency() == round(0.05 * 48000) == 2400
    assert dev.buffer.rate == 48000
    assert dev.buffer.position == 30 * 960


@pytest.mark.anyio
async def test_output_latency_is_rounded_not_truncated(fake_sd):
    """PortAudio reports latency as frames / rate; 1001 frames at 16 kHz must
    read back as 1001 samples (int() of 1001/16000*16000 gives 1000)."""
    sd = fake_sd(16000.0, 16000.0, blocks=3, out_latency=1001 / 16000)
    dev = LiveDevice()

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        pass

    await run_until(dev, sd, on_mic, lambda: all_streams_done(sd))
    assert dev.output_latency() == round(1001 / 16000 * 16000) == 1001


@pytest.mark.anyio
async def test_cancelling_run_stops_and_closes_streams_while_they_still_run(fake_sd):
    sd = fake_sd(16000.0, 16000.0, blocks=1000)
    gate = threading.Event()
    sd.gates[3] = gate  # the stream is alive and blocked when we cancel
    dev = LiveDevice()
    mic: list[bytes] = []

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        mic.append(data)

    await run_until(dev, sd, on_mic, lambda: len(mic) == 3)
    assert [s.kind for s in sd.streams] == ["input", "output"]
    for stream in sd.streams:
        assert stream.stopped and stream.closed
        assert stream.finished.wait(5)
        assert not stream.errors
    # (the first stream's stop opens the fake's gates: the other may make one more call before its own stop)
    assert sd.stream("input").calls == 3 and 3 <= sd.stream("output").calls <= 4


# -- silence held while the service waits (voice.audio.silence_hold) ---------------------


def quiet_but_one(loud: set[int]):
    """Digital silence, except the blocks in `loud`."""
    return lambda i, frames: mic_block(i, frames) if i in loud else np.zeros(frames, np.int32)


@pytest.mark.anyio
async def test_silence_is_handed_on_held_and_whole_and_sound_at_once_on_its_own(fake_sd):
    sd = fake_sd(16000.0, 16000.0, blocks=200, mic=quiet_but_one({150}))
    dev = LiveDevice(hold_silence_s=0.25, hold_floor_dbfs=-66.0, hold_after_quiet_s=2.0)  # 20 ms blocks
    mic: list[bytes] = []
    refs: list[bytes] = []

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        mic.append(data)
        refs.append(reference)

    await run_until(dev, sd, on_mic, lambda: all_streams_done(sd) and sum(map(len, mic)) == 200 * 640)
    got = np.frombuffer(b"".join(mic), np.int16)
    np.testing.assert_array_equal(got, np.concatenate(sd.stream("input").inputs))  # every sample, in order
    # the echo reference is whole too: what the speaker was handed, in order, none of it dropped while held
    played = np.concatenate([o[:, 0] for o in sd.stream("output").outputs])
    ref = np.frombuffer(b"".join(refs), np.int16)
    assert len(ref)
    np.testing.assert_array_equal(ref, played[:len(ref)])
    sizes = [len(b) // 2 for b in mic]
    # The first 2 s (100 blocks) of silence one by one, then held: blocks of at most 0.25 s (+ one).
    assert sizes[:100] == [320] * 100
    loud_at = sizes.index(320, 100)
    assert loud_at > 101 and all(320 < n <= 4000 + 320 for n in sizes[100:loud_at])
    # The loud block comes alone, right after the silence held before it, and is not diluted by it.
    assert sum(sizes[:loud_at]) == 150 * 320 and mic[loud_at] == mic_block(150, 320).astype(np.int16).tobytes()
    # After sound, 2 s of silence one by one again before holding starts.
    assert sizes[loud_at + 1:] == [320] * (200 - 151)


@pytest.mark.anyio
async def test_nothing_is_held_while_the_speaker_plays_or_for_2_s_after(fake_sd):
    sd = fake_sd(16000.0, 16000.0, blocks=260, mic=quiet_but_one(set()))
    dev = LiveDevice(hold_silence_s=0.25, hold_floor_dbfs=-66.0, hold_after_quiet_s=2.0)
    dev.buffer.enqueue(0, np.full(120 * 320, 3000, np.int16))  # plays for the first 120 blocks (2.4 s)
    mic: list[bytes] = []

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        mic.append(data)

    # (the last blocks may still be held when the stream stops: at most 0.25 s of silence, never handed on)
    await run_until(dev, sd, on_mic, lambda: all_streams_done(sd) and sum(map(len, mic)) >= (260 * 320 - 4320) * 2)
    sizes = [len(b) // 2 for b in mic]
    assert sizes[:220] == [320] * 220  # the reply's 120 blocks, then 2 s of the speaker's silence
    assert min(sizes[220:-1]) > 320


@pytest.mark.anyio
@pytest.mark.parametrize("rate", [16000.0, 44100.0, 48000.0])
async def test_held_silence_comes_in_blocks_that_a_recording_of_it_replays_with(fake_sd, tmp_path, rate):
    """#35: with `voice run`'s own block and hold, a quiet stretch reached the
    listener (and mic_blocks.txt) as blocks of a second and more, which the
    scenario loader refused ("block sizes must be from 1 to 16000 samples"),
    so a recording with a quiet second never replayed. The device's blocks,
    as recorded, must load."""
    from voice.audio.recording import BLOCKS, Recorder
    from voice.service.daemon import DEVICE_BLOCK_MS, HOLD_SILENCE_S
    from voice.service.scenario import load_scenario

    blocks = round(6 * 1000 / DEVICE_BLOCK_MS)  # 6 s of silence
    sd = fake_sd(rate, rate, blocks=blocks, mic=quiet_but_one(set()))
    dev = LiveDevice(block_ms=DEVICE_BLOCK_MS, hold_silence_s=HOLD_SILENCE_S, hold_floor_dbfs=-66.0)
    rec = tmp_path / "rec"
    recorder = Recorder.to_directory(rec)  # as `voice run --record` writes mic.wav and mic_blocks.txt
    sizes: list[int] = []

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        sizes.append(len(data) // 2)
        recorder.add(data, reference)

    # (the last second may still be held when the stream stops)
    await run_until(dev, sd, on_mic, lambda: all_streams_done(sd) and sum(sizes) >= 4.5 * 16000)
    recorder.close()
    assert max(sizes) > 16000, sizes  # held: a second of silence and the block that ended it, as one
    (rec / "scenario.toml").write_text(f'timing = "recorded"\nmic_blocks = "{BLOCKS}"\n'
                                       '[[user]]\naudio = "mic.wav"\nat = 0.0\n')
    assert load_scenario(rec / "scenario.toml").blocks == tuple(n for n in sizes if n)


def test_a_hold_that_would_make_blocks_no_recording_can_replay_is_refused():
    with pytest.raises(ValueError, match=r"hold_silence_s = 2.5 with 32 ms blocks makes mic blocks of up to 2.564 s, "
                                         r"over the 2 s a block may be"):
        LiveDevice(block_ms=32, hold_silence_s=2.5)


# -- a lost stream, told and reopened (issue #36; voice.audio.stream_life) -----------------------


told_at: list[float] = []  # when run_telling's device told each change (monotonic)


async def run_telling(dev: LiveDevice, on_mic, condition, *, timeout: float = 10.0) -> list:
    """Run the device with an `on_audio` that keeps what it is told, until `condition(told)`."""
    told: list = []
    told_at.clear()

    def tell(change) -> None:
        told.append(change)
        told_at.append(time.monotonic())

    async with anyio.create_task_group() as tg:
        tg.start_soon(dev.run, on_mic, tell)
        with anyio.fail_after(timeout):
            while not condition(told):
                await anyio.sleep(0.002)
        tg.cancel_scope.cancel()
    return told


def kinds(told: list) -> list[str]:
    return [type(t).__name__ for t in told]


@pytest.mark.anyio
async def test_a_stream_that_stops_calling_is_lost_within_a_second_then_reopened_with_portaudio_refreshed(fake_sd):
    from voice.audio.device import AudioBack, AudioLost

    sd = fake_sd(16000.0, 16000.0, blocks=[20, 1000])  # the first stream goes silent after 20 blocks
    dev = LiveDevice()
    mic: list[bytes] = []

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        mic.append(data)

    t0 = time.monotonic()
    told = await run_telling(dev, on_mic, lambda told: len(told) == 2 and len(mic) >= 30)
    first, second = sd.of_kind("input")
    assert len(sd.of_kind("output")) == 2
    assert 0.7 <= told_at[0] - first.last_call < 1.0, "a stall is known within a second, not before 0.7 s"
    assert kinds(told) == ["AudioLost", "AudioBack"], told
    lost, back = told
    assert isinstance(lost, AudioLost) and "stopped calling back" in lost.reason, lost
    assert isinstance(back, AudioBack) and back.attempts == 1 and back.devices == dev.describe()
    assert back.after_s < 1.0, back  # from the loss: the 0.2 s back-off, then the first mic block
    for stream in (first, sd.of_kind("output")[0]):
        assert stream.stopped and stream.closed and stream.calls == 20
    assert sd.terminated == sd.initialized == 1  # a fresh device list, with nothing of ours open
    assert second.started and second.stopped and second.closed  # (closed by the cancellation)
    assert len(mic) >= 30 and time.monotonic() - t0 < 5
    assert dev.audio_lost() is None


@pytest.mark.anyio
async def test_a_pinned_card_unplugged_falls_back_to_the_default_and_returns_when_plugged_in(fake_sd, monkeypatch):
    """A pinned USB card unplugged: its stream stops, and once PortAudio is
    re-initialised it is not listed: the default devices are opened, told
    once; plugged in (the system's sound devices change, and it is listed
    again): the pinned one is opened again, told once, with no loss."""
    from voice.audio import live
    from voice.audio.device import PinnedChange

    sd = fake_sd(16000.0, 16000.0, blocks=[20, 100000])
    plugged = {"yes": True}
    listed = sd.module.query_devices

    def query_devices(device=None, kind=None):
        if device == "USB" and not plugged["yes"]:
            raise ValueError("No input device matching 'USB'")
        return listed(device, kind)

    sd.module.query_devices = query_devices
    monkeypatch.setattr(live, "sound_devices", lambda: plugged["yes"])
    monkeypatch.setattr(live, "DEVICES_CHECK_S", 0.05)
    dev = LiveDevice("USB", "USB")
    plugged["yes"] = False  # unplugged after the start (one missing at start is an error)

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        pass

    def until(told: list) -> bool:
        if kinds(told) == ["AudioLost", "PinnedChange", "AudioBack"]:
            plugged["yes"] = True
        return len(told) == 4

    told = await run_telling(dev, on_mic, until)
    assert kinds(told) == ["AudioLost", "PinnedChange", "AudioBack", "PinnedChange"], told
    gone, back = told[1], told[3]
    assert isinstance(gone, PinnedChange) and not gone.present and gone.pinned == "mic 'USB' and speaker 'USB'"
    assert isinstance(back, PinnedChange) and back.present and "fake input USB" in back.devices, back
    assert [s.device for s in sd.of_kind("input")] == [s.device for s in sd.of_kind("output")] == ["USB", None, "USB"]
    assert sd.terminated == sd.initialized == 2  # a fresh device list before each reopening


@pytest.mark.anyio
async def test_a_pinned_card_listed_but_busy_after_a_loss_falls_back_to_the_default_not_deaf(fake_sd):
    """A pinned card plugged back in that the audio server holds: PortAudio
    lists it, but it will not open: the default devices are used, not a
    service retrying a busy card for ever."""
    sd = fake_sd(16000.0, 16000.0, blocks=[20, 100000])

    def busy(kind: str, stream):
        def opening(**kw):
            if kw["device"] == "USB" and sd.of_kind(kind):  # the first opening worked
                raise FakePortAudioError("Error opening Stream: Device unavailable [PaErrorCode -9985]")
            return stream(**kw)
        return opening

    sd.module.InputStream = busy("input", sd.module.InputStream)
    sd.module.OutputStream = busy("output", sd.module.OutputStream)
    dev = LiveDevice("USB", "USB")
    mic: list[bytes] = []

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        mic.append(data)

    told = await run_telling(dev, on_mic, lambda told: len(told) == 3 and len(mic) > 40)
    assert kinds(told) == ["AudioLost", "PinnedChange", "AudioBack"], told
    assert not told[1].present
    assert [s.device for s in sd.of_kind("input")] == [s.device for s in sd.of_kind("output")] == ["USB", None]


@pytest.mark.anyio
async def test_a_stream_that_ends_on_its_own_is_lost(fake_sd):
    sd = fake_sd(16000.0, 16000.0, blocks=[5, 1000], ends=True)
    dev = LiveDevice()

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        pass

    told = await run_telling(dev, on_mic, lambda told: len(told) == 2)
    assert kinds(told) == ["AudioLost", "AudioBack"]
    assert told[0].reason == "the stream ended on its own"
    assert len(sd.of_kind("input")) == len(sd.of_kind("output")) == 2


@pytest.mark.anyio
async def test_errors_on_every_block_are_a_loss_and_an_xrun_now_and_then_is_not(fake_sd):
    flagged = {i for i in range(3, 200) if i % 7 == 0} | set(range(100, 115))  # xruns, then an error on every block
    sd = fake_sd(16000.0, 16000.0, blocks=[400, 1000], status=lambda i: "output underflow" if i in flagged else None)
    dev = LiveDevice()

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        pass

    told = await run_telling(dev, on_mic, lambda told: len(told) == 2)
    assert kinds(told) == ["AudioLost", "AudioBack"]
    assert "reported errors on 10 blocks in a row" in told[0].reason, told[0]
    # not at the scattered xruns before block 100 (and it calls on until it is closed)
    assert 110 <= sd.of_kind("input")[0].calls < 400


@pytest.mark.anyio
async def test_reopening_retries_with_back_off_while_the_server_is_gone_and_counts_for_the_watchdog(fake_sd):
    sd = fake_sd(48000.0, 16000.0, blocks=[10, 1000])
    dev = LiveDevice()
    seen: list = []

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        pass

    async def watch_state() -> None:
        while True:
            seen.append(dev.audio_lost())
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        told: list = []
        tg.start_soon(dev.run, on_mic, told.append)
        tg.start_soon(watch_state)
        with anyio.fail_after(5):
            while not told:
                await anyio.sleep(0.002)
        sd.open_errors = 3  # the server is still gone: tries after 0.2, 0.4, 0.8 and 1.6 s
        t_lost = time.monotonic()
        with anyio.fail_after(10):
            while len(told) < 2:
                await anyio.sleep(0.002)
        t_back = time.monotonic()
        tg.cancel_scope.cancel()
    assert kinds(told) == ["AudioLost", "AudioBack"]
    assert told[1].attempts == 4, told[1]
    assert 2.9 <= t_back - t_lost < 4.5, t_back - t_lost
    assert dev.retries >= 4  # each loss and each try moves it (voice.service.daemon feeds the watchdog by it)
    during = [s for s in seen if s is not None]
    assert during and during[-1]["attempts"] == 3 and "Device unavailable" in during[-1]["error"], during[-1]
    assert during[-1]["reason"] == told[0].reason
    # separate input and output streams, both reopened
    assert len(sd.of_kind("input")) == len(sd.of_kind("output")) == 2


@pytest.mark.anyio
async def test_a_stream_whose_stop_never_returns_is_left_and_portaudio_is_not_terminated_under_it(fake_sd, monkeypatch,
                                                                                                 capsys):
    """PortAudio 19.6 (#1037): the stream of a dead audio server cannot be
    stopped. Its closing is given up after a second; the device reopens
    without re-initialising PortAudio (which would close it, and hang)."""
    import voice.audio.stream_life as life

    silenced: list[bool] = []
    monkeypatch.setattr(life, "silence_c_stderr", lambda: silenced.append(True))
    sd = fake_sd(16000.0, 16000.0, blocks=[10, 1000], wedged=True)
    dev = LiveDevice()

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        pass

    try:
        t0 = time.monotonic()
        told = await run_telling(dev, on_mic, lambda told: len(told) == 2)
        assert kinds(told) == ["AudioLost", "AudioBack"]
        assert time.monotonic() - t0 < 4  # the stall (0.7 s), a second to give up its close, another at the cancellation
        assert sd.terminated == sd.initialized == 0
        assert sd.module._initialized == 0  # sounddevice's exit handler will not terminate PortAudio either
        assert len(sd.of_kind("input")) == len(sd.of_kind("output")) == 2
        assert silenced  # the wedged thread's endless messages (the reopened one wedges too, as it is cancelled)
        assert "cannot be closed (a PortAudio 19.6 bug" in capsys.readouterr().err
    finally:
        sd.unwedge.set()


@pytest.mark.anyio
async def test_after_a_loss_nothing_more_is_pulled_and_heard_to_is_what_had_left_the_device(fake_sd):
    sd = fake_sd(16000.0, 16000.0, blocks=[20, 1000])
    dev = LiveDevice()
    dev.buffer.enqueue("s", np.arange(1, 30001, dtype=np.int16))

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        pass

    async with anyio.create_task_group() as tg:
        told: list = []
        tg.start_soon(dev.run, on_mic, told.append)
        with anyio.fail_after(5):
            while not told:
                await anyio.sleep(0.002)
        position = dev.buffer.position
        tg.cancel_scope.cancel()
    (lost,) = told
    assert position == dev.buffer.handed("s") == 20 * 320  # nothing was pulled after the stall
    # the last block's 320 samples and its 50 ms DAC delay were still in the device when it stopped
    assert lost.heard_to == 20 * 320 - 320 - 800


@pytest.mark.anyio
async def test_a_stream_gets_longer_for_its_first_call_but_one_that_never_calls_is_lost(fake_sd, monkeypatch):
    import voice.audio.stream_life as life

    monkeypatch.setattr(life, "FIRST_CALL_S", 1.0)
    sd = fake_sd(16000.0, 16000.0, blocks=[1000, 1000])
    sd.gates[0] = first = threading.Event()  # the first stream's first call waits, as a slow start's does
    dev = LiveDevice()
    mic: list[bytes] = []

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        mic.append(data)

    async with anyio.create_task_group() as tg:
        told: list = []
        tg.start_soon(dev.run, on_mic, told.append)
        await anyio.sleep(0.8)  # past STALL_S: not lost, it has not called yet
        assert told == []
        first.set()
        with anyio.fail_after(5):
            while len(mic) < 5:
                await anyio.sleep(0.002)
        tg.cancel_scope.cancel()
    assert told == [] and len(sd.of_kind("input")) == len(sd.of_kind("output")) == 1

    sd = fake_sd(16000.0, 16000.0, blocks=[0, 1000])  # never calls back
    dev = LiveDevice()
    told = await run_telling(dev, on_mic, lambda told: len(told) == 2)
    assert told[0].reason.startswith("the input stream never called back ("), told[0]


@pytest.mark.anyio
async def test_reopen_after_a_sleep_is_told_at_once_and_what_is_queued_after_the_cut_plays_on_the_new_streams(fake_sd):
    """The computer woke (voice.speech.after_sleep): the streams are lost
    at once, told before `reopen` returns, and opened again; the cut's
    clear is done then, so a timer queued at resume is not dropped by it."""
    from voice.audio.device import AudioLost

    sd = fake_sd(16000.0, 16000.0, blocks=[5000, 5000])
    dev = LiveDevice()
    reply = np.ones(5000 * 320, np.int16)
    dev.buffer.enqueue("reply", reply)
    told: list = []

    def tell(change) -> None:
        told.append(change)
        if isinstance(change, AudioLost):
            dev.buffer.request_clear()  # as the session does (voice.speech.audio_loss): the reply is cut

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(dev.run, on_mic, tell)
        with anyio.fail_after(5):
            while dev.buffer.handed("reply") < 50 * 320:
                await anyio.sleep(0.002)
        dev.reopen("the computer slept for eight hours")
        assert kinds(told) == ["AudioLost"] and told[0].reason == "the computer slept for eight hours"
        cut_at = dev.buffer.handed("reply")
        dev.buffer.enqueue("timer", np.full(3200, 7, np.int16))  # a timer ringing at resume
        with anyio.fail_after(5):
            while dev.buffer.handed("timer") < 3200:
                await anyio.sleep(0.002)
        tg.cancel_scope.cancel()
    assert kinds(told) == ["AudioLost", "AudioBack"]
    assert 50 * 320 <= cut_at == dev.buffer.handed("reply") < len(reply)  # nothing of the reply after the cut
    first, second = sd.of_kind("output")
    assert first.stopped and first.closed and second.started
    dev.reopen("again, while no stream runs")  # (the device has ended: nothing to lose)
    assert len(told) == 2


# -- a muted microphone (exact digital zeros) ----------------------------------------------


def muted_then_sound(muted_blocks: int):
    """Exact zeros (a mute key) for `muted_blocks` blocks, then sound."""
    return lambda i, frames: np.zeros(frames, np.int32) if i < muted_blocks else mic_block(i, frames)


@pytest.mark.anyio
@pytest.mark.parametrize("hold_silence_s", [0.0, 1.0])
async def test_a_mic_of_exact_zeros_for_over_10_s_is_told_muted_once_then_unmuted(fake_sd, hold_silence_s):
    """#36.1: 10.5 s of exact zeros at 48 kHz, then sound: `MicMuted` once,
    then `MicUnmuted`, and no `AudioLost` between them (the stream is
    alive); the silence hold (which holds such blocks back) changes none of it."""
    from voice.audio.device import MicMuted, MicUnmuted

    blocks = 560  # 11.2 s of 20 ms blocks: 525 of zeros (10.5 s), then sound
    sd = fake_sd(48000.0, 48000.0, blocks=blocks, mic=muted_then_sound(525))
    dev = LiveDevice(hold_silence_s=hold_silence_s)
    changes: list = []
    muted_while_zeros: list = []

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        pass

    def on_audio(change) -> None:
        changes.append(change)
        muted_while_zeros.append(dev.mic_muted())

    async with anyio.create_task_group() as tg:
        tg.start_soon(dev.run, on_mic, on_audio)
        with anyio.fail_after(20):
            while not all_streams_done(sd):
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert [type(c) for c in changes[:2]] == [MicMuted, MicUnmuted], changes
    assert 10.0 < changes[0].silent_s <= 10.5 and changes[1].muted_s == pytest.approx(10.5), changes
    assert muted_while_zeros[0] is not None and muted_while_zeros[1] is None
    assert dev.mic_muted() is None


@pytest.mark.anyio
async def test_a_quiet_mic_is_never_muted(fake_sd):
    """A quiet room is not a mute key: 12 s of the faintest noise (±1, under
    the silence hold's floor, so held) is never told muted."""
    from voice.audio.device import MicMuted

    rng = np.random.default_rng(3)
    sd = fake_sd(16000.0, 16000.0, blocks=600, mic=lambda i, frames: rng.integers(-1, 2, frames))
    dev = LiveDevice(hold_silence_s=1.0)
    changes: list = []

    async def on_mic(data: bytes, reference: bytes = b"") -> None:
        pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(dev.run, on_mic, changes.append)
        with anyio.fail_after(20):
            while not all_streams_done(sd):
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert not [c for c in changes if isinstance(c, MicMuted)], changes
    assert dev.mic_muted() is None
