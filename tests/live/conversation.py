"""A live barge-in conversation through `voice run` on the virtual devices,
recorded on both sides; shared by tests/live/test_live_barge_in.py and
benchmarks/live.py.

The person asks for three facts (three_points.wav into the mic), the
scripted model answers at length, and `BARGE_IN_AFTER_S` after the answer's
first sample reached the speaker the person says "Stop. Tell me something
else instead." (stop.wav); the short second answer plays to the end. The
speaker and the mic feed are recorded from their monitors with every chunk
stamped on the monotonic clock, which is also the clock of the daemon's
log (`at_mono`), so times from all three can be compared.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from output_lines import OutputLines

from .audio_server import AudioServer, Recorder

ROOT = Path(__file__).resolve().parents[2]
AUDIO = ROOT / "tests" / "fixtures" / "audio"
RATE = 16000
FRAME = RATE // 100  # 10 ms analysis frames
LOUD = 200  # a frame whose peak exceeds this holds speech (the virtual speaker's silence is exact zeros)

FIRST = ("First, the sea covers most of the planet. Second, it holds nearly all of the water on Earth. "
         "Third, its deepest point is almost eleven kilometres down.")
SECOND = "Of course. Honey never spoils if it is kept sealed."
SCRIPT = f"""
[[reply]]
chunk_delay_ms = 40
text = "{FIRST}"

[[reply]]
chunk_delay_ms = 40
text = "{SECOND}"
"""
BARGE_IN_AFTER_S = 3.0  # after the reply's first sample reached the speaker: inside its second sentence


class LiveFailure(AssertionError):
    pass


class LiveDaemon:
    """`voice run --llm scripted:FILE` on the virtual devices with its XDG
    state, data and config dirs in `tmp`. XDG_RUNTIME_DIR is the audio
    server's private one (PipeWire's sockets are there), so the control
    socket is private too."""

    def __init__(self, tmp: Path, audio: AudioServer, script: Path | None = None, *, config: str | None = None,
                 args: tuple[str, ...] = (), listen_mode: str = "open", device_rate: int | None = None):
        tmp.mkdir(parents=True, exist_ok=True)
        self.audio = audio
        self.db = tmp / "events.db"
        self.env = {**audio.env, "XDG_STATE_HOME": str(tmp / "state"), "XDG_DATA_HOME": str(tmp / "data"),
                    "XDG_CONFIG_HOME": str(tmp / "config"), "HF_HUB_OFFLINE": "1",
                    # the person speaks without the wake word; wake mode has its own replay test
                    "VOICE_LISTEN_MODE": listen_mode}
        if device_rate is not None:  # the rate PortAudio reports for ALSA's default device (else 44.1 kHz here)
            self.env["PIPEWIRE_ALSA"] = f"{{ alsa.rate = {device_rate} }}"
        if config is not None:
            (tmp / "config" / "voice").mkdir(parents=True, exist_ok=True)
            (tmp / "config" / "voice" / "voice.toml").write_text(config)
        if script is None:
            script = tmp / "replies.toml"
            script.write_text(SCRIPT)
        self.proc = subprocess.Popen([sys.executable, "-m", "voice", "run", "--db", str(self.db),
                                      "--llm", f"scripted:{script}", *args], cwd=ROOT, env=self.env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._lines = OutputLines(self.proc)
        self.out, self.err = self._lines.out, self._lines.err

    def wait(self, condition, timeout: float, what: str, poll_s: float = 0.02) -> None:
        """Until `condition()`; `poll_s` apart (a condition that asks the audio
        server its graph costs it a client each time: not every 20 ms, which
        was seen to leave new links carrying silence)."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None:
                time.sleep(0.2)
                raise LiveFailure(f"voice run exited ({self.proc.returncode}) while waiting for {what}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise LiveFailure(f"timed out ({timeout:.0f} s) waiting for {what}:\n{self.log()}")
            time.sleep(poll_s)

    def wait_listening(self, timeout: float = 90) -> None:
        """The daemon says it listens, and the audio server runs its streams'
        links: it links a new stream on its own time, and words spoken
        before that are not heard by anyone."""
        self.wait(lambda: any(line.startswith("listening") for line in self.err), timeout, "the daemon to listen")
        self.wait(self.audio.service_linked, 10, "the audio server to run the daemon's links", poll_s=0.5)

    def log(self) -> str:
        return "stdout:\n" + "\n".join(self.out[-20:]) + "\nstderr:\n" + "\n".join(self.err[-40:])

    def replies(self) -> list[str]:
        return [line for line in self.out if line.startswith("assistant:")]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._lines.join()
        return self.proc.returncode

    def events(self):
        from voice.log.store import EventStore

        store = EventStore(self.db)
        try:
            return store.events()
        finally:
            store.close()


# -- reading the recordings ----------------------------------------------------------


def loud_frames(x: np.ndarray) -> np.ndarray:
    n = len(x) // FRAME
    return np.abs(x[: n * FRAME].reshape(n, FRAME).astype(np.int32)).max(axis=1) > LOUD


def first_loud(x: np.ndarray, start: int = 0) -> int | None:
    """The start of the first loud frame at or after `start`."""
    loud = np.flatnonzero(loud_frames(x[start:]))
    return None if len(loud) == 0 else start + int(loud[0]) * FRAME


def end_before_gap(x: np.ndarray, start: int, gap_s: float) -> int | None:
    """The end of the last loud frame before the first silence of `gap_s`
    that begins at or after `start`."""
    loud = loud_frames(x)
    need = round(gap_s * 100)
    run = 0
    for i in range(start // FRAME, len(loud)):
        run = 0 if loud[i] else run + 1
        if run == need:
            return (i - need + 1) * FRAME
    return None


def write_wav(path: Path, x: np.ndarray, rate: int = RATE) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(x.astype(np.int16).tobytes())


# -- the conversation ------------------------------------------------------------------------


@dataclass
class Conversation:
    daemon: LiveDaemon
    returncode: int
    speaker: np.ndarray  # 16 kHz, what the virtual speaker played
    mic: np.ndarray  # 16 kHz, what the virtual mic was fed
    speaker_rec: Recorder
    mic_rec: Recorder
    reply_start: int  # speaker sample: the first reply's first loud frame
    barge_in_at: float  # monotonic: when stop.wav was started into the mic

    def barge_in_onset(self) -> tuple[int, float]:
        """The barge-in's first loud frame in the mic feed: (sample, monotonic time)."""
        onset = first_loud(self.mic, self.mic_rec.index_at(self.barge_in_at))
        if onset is None:
            raise LiveFailure("the barge-in never reached the mic feed")
        return onset, self.mic_rec.time_of(onset)

    def reply_end(self, after_t: float, gap_s: float = 1.0) -> tuple[int, float]:
        """Where the speaker fell silent (for `gap_s`) after time `after_t`:
        the end of the cut reply's audio, (sample, monotonic time)."""
        end = end_before_gap(self.speaker, self.speaker_rec.index_at(after_t), gap_s)
        if end is None:
            raise LiveFailure("the speaker never fell silent after the barge-in")
        return end, self.speaker_rec.time_of(end)


def converse(audio: AudioServer, tmp: Path, *, barge_in_after: float = BARGE_IN_AFTER_S,
             config: str | None = None, barge_in: Path = AUDIO / "stop.wav", settle=None,
             args: tuple[str, ...] = (), device_rate: int | None = None) -> Conversation:
    """`barge_in` is what the person says over the first reply; `settle(daemon)`
    waits for what should follow it (default: the second reply, played out);
    `args` go to `voice run`; `device_rate`: the rate PortAudio's default
    device reports (None: what this machine's PipeWire gives, 44.1 kHz)."""
    speaker = audio.record("speaker.monitor")
    mic = audio.record("micfeed.monitor")
    daemon = LiveDaemon(tmp, audio, config=config, args=args, device_rate=device_rate)
    reply_start = barge_in_at = None
    try:
        daemon.wait_listening()
        time.sleep(0.3)
        asked = audio.play(AUDIO / "three_points.wav")
        daemon.wait(lambda: first_loud(speaker.samples()) is not None, 30, "the reply on the speaker")
        reply_start = first_loud(speaker.samples())
        time.sleep(max(0.0, speaker.time_of(reply_start) + barge_in_after - time.monotonic()))
        barge_in_at = time.monotonic()
        stop = audio.play(barge_in)
        if settle is not None:
            settle(daemon)
        else:
            daemon.wait(lambda: len(daemon.replies()) >= 2, 40, "the second reply")
            time.sleep(0.5)  # the transcript line comes once the reply has played out; keep a margin of silence
        for p in (asked, stop):
            if p.wait(5) != 0:
                raise LiveFailure(f"paplay failed: {p.stderr.read()}")
    finally:
        speaker.stop()
        mic.stop()
        rc = daemon.stop()
        (tmp / "daemon.log").write_text(daemon.log())
        write_wav(tmp / "speaker.wav", speaker.samples())
        write_wav(tmp / "mic.wav", mic.samples())
    return Conversation(daemon, rc, speaker.samples(), mic.samples(), speaker, mic, reply_start, barge_in_at)


# -- one request and its reply, timed (benchmarks/live.py: voice-to-voice) ---------------------------


@dataclass
class Exchange:
    """One request played into the mic and its reply, on the monotonic clock."""

    played_at: float  # when the request's WAV was started into the mic feed
    request_end: float  # its last loud sample in the mic feed
    reply_start: float  # the reply's first loud sample on the speaker

    @property
    def v2v_ms(self) -> float:
        return (self.reply_start - self.request_end) * 1000


def ask(audio: AudioServer, daemon: LiveDaemon, speaker: Recorder, mic: Recorder, wav: Path, *,
        gap_s: float = 0.8, timeout: float = 60) -> Exchange:
    """Play `wav` into the mic and wait for its reply to play out (the
    transcript's `assistant:` line comes after its last sample). The request's
    end is the last loud frame before `gap_s` of silence from its first loud
    frame: longer than the pauses inside a request (the 0.4 s after "Okay
    Nabu.", espeak's between words), shorter than the wait for the reply."""
    replies = len(daemon.replies())
    played_at = time.monotonic()
    player = audio.play(wav)
    daemon.wait(lambda: len(daemon.replies()) > replies, timeout, f"the reply to {wav.name}")
    if player.wait(5) != 0:
        raise LiveFailure(f"paplay failed: {player.stderr.read()}")
    heard = mic.samples()
    onset = first_loud(heard, mic.index_at(played_at))
    end = None if onset is None else end_before_gap(heard, onset, gap_s)
    if end is None:
        raise LiveFailure(f"{wav.name} never reached the mic feed, or never ended there")
    request_end = mic.time_of(end)
    played = speaker.samples()
    start = first_loud(played, speaker.index_at(request_end))
    if start is None:
        raise LiveFailure(f"the reply to {wav.name} never reached the speaker:\n{daemon.log()}")
    return Exchange(played_at, request_end, speaker.time_of(start))


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads."""
    return _stat_cpu_seconds(Path(f"/proc/{pid}"))


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """utime + stime of each thread of a process, by thread id."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = _stat_cpu_seconds(task)
        except OSError:  # the thread ended meanwhile
            continue
    return out


def _stat_cpu_seconds(proc_dir: Path) -> float:
    fields = (proc_dir / "stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
