"""A listener that does only what the moment needs (issue #17): the VAD runs
only while speech could matter and the mic carries sound (voice.speech.vad_gate,
ListenGate.expects_speech), and echo cancellation only while there is echo to
cancel (voice.audio.echo). What they save is measured in benchmarks/live.py
(--idle-only); here: that they switch on whenever they are needed."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from voice.audio.listening import ListenGate
from voice.speech.vad_gate import HOLD_S, SoundGate, VadGate

ROOT = Path(__file__).resolve().parents[1]
RATE = 16000
BLOCK = 320


def block(level_dbfs: float | None) -> bytes:
    """A 20 ms block of a 300 Hz tone at `level_dbfs` RMS (None: digital silence)."""
    if level_dbfs is None:
        return bytes(BLOCK * 2)
    t = np.arange(BLOCK) / RATE
    tone = np.sin(2 * np.pi * 300 * t) * np.sqrt(2) * 32768 * 10 ** (level_dbfs / 20)
    return tone.astype(np.int16).tobytes()


def test_in_wake_mode_speech_is_expected_only_after_a_wake_word_or_in_the_window():
    gate = ListenGate("wake", window_s=8.0)
    assert not gate.expects_speech(1.0)  # nobody has said the wake word: only the detector listens
    gate.on_wake(2.0)
    assert gate.expects_speech(2.1) and gate.expects_speech(11.9)
    gate.consume()
    assert not gate.expects_speech(12.5)
    gate.on_assistant_stopped(20.0)
    assert gate.expects_speech(19.6) and gate.expects_speech(27.9)  # the follow-up window, with its slack
    assert not gate.expects_speech(28.5)
    assert ListenGate("open").expects_speech(0.0)


def test_the_sound_gate_stays_shut_on_silence_and_a_quiet_room():
    gate = SoundGate()
    for i in range(1, 200):
        assert not gate.update(block(None if i % 2 else -70.0), i * BLOCK) and not gate.opened


def test_sound_opens_the_gate_at_once_and_it_stays_open_for_a_while():
    gate = SoundGate()
    assert not gate.update(block(None), BLOCK)
    assert gate.update(block(-40.0), 2 * BLOCK) and gate.opened  # the listener feeds the pre-roll first
    end = 2 * BLOCK
    while end < 2 * BLOCK + HOLD_S * RATE:
        end += BLOCK
        assert gate.update(block(None), end) and not gate.opened
    assert not gate.update(block(None), end + BLOCK)


def test_the_vad_runs_on_sound_when_speech_is_expected_and_always_while_it_is_deciding():
    gate = VadGate()
    assert not gate.should_run(False, deciding=False, busy=False, expected=True)  # silence
    assert gate.should_run(True, deciding=False, busy=False, expected=True) and gate.restarting
    assert gate.should_run(True, deciding=False, busy=False, expected=True) and not gate.restarting
    assert gate.should_run(False, deciding=True, busy=False, expected=False)  # mid-utterance
    assert not gate.should_run(True, deciding=False, busy=False, expected=False)  # wake mode, no wake word
    assert gate.should_run(True, deciding=False, busy=True, expected=False)  # wake mode, over the reply
    # Busy on silence: no rest that depends on when the turn began (a replay's words would)
    assert not gate.should_run(False, deciding=False, busy=True, expected=True)
    assert gate.should_run(True, deciding=False, busy=True, expected=True) and gate.restarting


def test_the_wake_word_is_heard_after_silence_with_the_detector_resting_on_it():
    """The listener feeds the wake-word model only while the SoundGate is
    open, over the pre-roll first: after seconds of silence "Okay Nabu" is
    still detected, within a block or two of where the always-on detector
    finds it, and the model ran on under half the blocks."""
    from collections import deque

    from voice.audio.wakeword import WakeWordDetector

    wav = ROOT / "tests" / "fixtures" / "audio" / "okay_nabu_what_time.wav"
    with wave.open(str(wav)) as w:
        speech = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    stream = np.concatenate([np.zeros(4 * RATE, np.int16), speech, np.zeros(4 * RATE, np.int16)])
    always, gated, sound = WakeWordDetector(), WakeWordDetector(), SoundGate()
    preroll: deque[bytes] = deque(maxlen=int(0.5 * RATE / BLOCK))
    found: dict[str, list[int]] = {"always": [], "gated": []}
    ran = 0
    for end in range(BLOCK, len(stream) + 1, BLOCK):
        b = stream[end - BLOCK:end].tobytes()
        if always.process(b):
            found["always"].append(end)
        if sound.update(b, end):
            for earlier in preroll if sound.opened else ():
                gated.process(earlier)
            ran += 1
            if gated.process(b):
                found["gated"].append(end)
        preroll.append(b)
    (a,), (g,) = found["always"], found["gated"]
    assert abs(a - g) <= 2 * BLOCK, found
    assert ran < len(stream) // BLOCK / 2, ran


@pytest.fixture
def canceller():
    from voice.audio.echo import EchoCanceller, EchoUnavailable

    try:
        return EchoCanceller()
    except EchoUnavailable as exc:
        pytest.skip(str(exc))


def test_echo_cancellation_rests_when_nothing_plays_and_passes_the_mic_through_untouched(canceller):
    from voice.audio.echo import TAIL_S

    rng = np.random.default_rng(5)
    mic = [(rng.standard_normal(BLOCK) * 300).astype(np.int16).tobytes() for _ in range(int(TAIL_S * 50) + 20)]
    out = [canceller.process(m, bytes(BLOCK * 2), busy=False) for m in mic]
    assert not canceller.running
    assert b"".join(out[-10:]) == b"".join(mic[-10:])  # nothing to cancel: exactly the mic
    canceller.process(mic[0], bytes(BLOCK * 2), busy=True)  # a turn began: the reply may play any moment
    assert canceller.running


def test_echo_cancellation_runs_while_the_speaker_plays_and_for_its_echo_after(canceller):
    from voice.audio.echo import TAIL_S

    loud = (np.sin(np.arange(BLOCK) / 3) * 8000).astype(np.int16).tobytes()
    quiet = bytes(BLOCK * 2)
    for _ in range(100):
        canceller.process(quiet, loud, busy=False)  # a notice playing while no turn runs
        assert canceller.running
    for _ in range(int(TAIL_S * 50) - 2):
        canceller.process(quiet, quiet, busy=False)
        assert canceller.running  # the room's echo of what just played
    for _ in range(5):
        canceller.process(quiet, quiet, busy=False)
    assert not canceller.running


def _dbfs(pcm: bytes) -> float:
    samples = np.frombuffer(pcm, np.int16).astype(np.float64)
    return 20 * np.log10(np.sqrt(np.mean(samples**2)) / 32768 + 1e-9)


def test_what_the_canceller_leaves_far_under_the_echo_is_taken_down(canceller):
    """Laptop speakers: what plays (-12 dBFS) comes back 40 ms later at -6 dB.
    A quiet sound under that echo (-55 dBFS: what the canceller leaves while
    it converges is of that kind) reaches the VAD 40 dB down. (A person
    talking over the echo goes through: tests/test_voice_replay.py,
    test_a_real_barge_in_still_cuts_through_the_echo, with real voices; AEC3
    itself takes white noise at the echo's level for echo.)"""
    rng = np.random.default_rng(7)
    played = (rng.standard_normal(BLOCK * 150) * 8000).astype(np.int16)
    echo = np.concatenate([np.zeros(2 * BLOCK), played[: -2 * BLOCK] * 0.5])

    def run(frames: range, near: float) -> tuple[bytes, bytes]:
        sent, out = [], []
        for k in frames:
            part = slice(k * BLOCK, (k + 1) * BLOCK)
            mic = (echo[part] + rng.standard_normal(BLOCK) * near).astype(np.int16)
            if k >= frames.start + 10:
                sent.append((mic - echo[part].astype(np.int16)).tobytes())  # the mic without the echo
            out.append(canceller.process(mic.tobytes(), played[part].tobytes()))
        return b"".join(sent), b"".join(out[10:])

    faint, out = run(range(0, 150), 60)
    assert _dbfs(out) < _dbfs(faint) - 30
