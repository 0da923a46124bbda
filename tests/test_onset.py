"""The pause from the first frames of speech (voice.speech.onset): the reply
goes quiet on the first 32 ms frame Silero scores as speech, before the
VAD's smoothed SPEAKING, and a sound that SPEAKING never follows is
withdrawn at once, with no word lost.

The detector is checked on the real model and real fixtures; the session
behaviour on scripted timelines (tests/timeline.py: the real VAD, pipeline,
barge-in control and log)."""

from __future__ import annotations

import numpy as np
import pytest
from pipecat.audio.vad.vad_analyzer import VADParams, VADState

from timeline import AUDIO, Timeline, at, barge_in, run_timeline
from voice.audio.wav import read_mono16k, write_wav
from voice.log import events as ev
from voice.speech.barge_in import TENTATIVE_S
from voice.speech.onset import FRAME, FrameScoringSilero, OnsetDetector

RATE = 16000
BLOCK = 320  # the pipeline's 20 ms mic block
ASK = at(0.5, "three_points.wav", "Give me three points about the sea.")
FOUR_POINTS = ("First, the sea covers most of the planet. Second, it holds nearly all of the water on Earth. "
               "Third, its deepest point is almost eleven kilometres down. Fourth, most of it has never been explored.")


def first_loud(samples: np.ndarray) -> int:
    return int(np.flatnonzero(np.abs(samples.astype(np.int32)) > 500)[0])  # the replay's onset rule


def listen(signal: np.ndarray) -> tuple[list[int], list[int]]:
    """Feed `signal` in 20 ms blocks as the listener does: (onsets found,
    block ends where the analyzer turned SPEAKING)."""
    analyzer = FrameScoringSilero(sample_rate=RATE, params=VADParams(confidence=0.7, start_secs=0.05, stop_secs=0.6,
                                                                    min_volume=0.4))
    analyzer.set_sample_rate(RATE)
    detector = OnsetDetector(analyzer.params.confidence)
    onsets, speaking = [], []
    try:
        for end in range(BLOCK, len(signal) + 1, BLOCK):
            state = analyzer._run_analyzer(signal[end - BLOCK:end].tobytes())
            onset = detector.feed(analyzer.take_frames(), end)
            if onset is not None:
                onsets.append(onset)
            if state == VADState.SPEAKING and not speaking:
                speaking.append(end)
    finally:
        analyzer._executor.shutdown(wait=True)
    return onsets, speaking


def padded(samples: np.ndarray, before: int = 7000) -> np.ndarray:
    return np.concatenate([np.zeros(before, np.int16), samples, np.zeros(RATE // 2, np.int16)])


def test_the_first_voiced_frame_is_found_long_before_speaking():
    signal = padded(read_mono16k(AUDIO / "wait.wav"))
    onsets, speaking = listen(signal)
    onset = first_loud(signal)
    assert onsets and speaking
    assert abs(onsets[0] - onset) < FRAME  # the frame the speech starts in
    assert onsets[0] + 2 * FRAME <= onset + 80 * RATE // 1000  # known within 80 ms of the onset
    assert speaking[0] - onsets[0] >= 100 * RATE // 1000  # the smoothed SPEAKING comes 100+ ms later


def test_quiet_speech_and_loud_noise_are_no_onset():
    wait = read_mono16k(AUDIO / "wait.wav")
    quiet = (wait.astype(np.float64) * 10 ** (-40 / 20)).astype(np.int16)  # speech under the level floor
    assert listen(padded(quiet))[0] == []
    rng = np.random.default_rng(3)
    noise = (rng.standard_normal(2 * RATE) * 0.2 * 32767).astype(np.int16)  # -14 dBFS white noise
    assert listen(padded(noise))[0] == []


def test_the_position_holds_whatever_the_block_alignment():
    wait = read_mono16k(AUDIO / "wait.wav")
    found = []
    for shift in (0, 100, 333, 511):
        signal = padded(wait, 7000 + shift)
        found.append(listen(signal)[0][0] - first_loud(signal))
    assert all(abs(d) < FRAME for d in found), found  # within one frame of where the speech begins


@pytest.fixture
def blip(tmp_path) -> str:
    """A 100 ms piece of a voiced word: Silero calls its frames speech, the
    VAD never says SPEAKING (too short for its volume gate)."""
    wait = read_mono16k(AUDIO / "wait.wav")
    start = first_loud(wait)
    piece = wait[start:start + RATE // 10].astype(np.float64)
    ramp = np.minimum(1.0, np.minimum(np.arange(len(piece)), np.arange(len(piece))[::-1]) / 80)
    path = tmp_path / "blip.wav"
    write_wav(path, np.concatenate([(piece * ramp).astype(np.int16), np.zeros(RATE // 2, np.int16)]), RATE)
    onsets, speaking = listen(padded(read_mono16k(path)))
    assert onsets and not speaking  # what the fixture is for
    return str(path)


def test_a_sound_the_vad_never_calls_speech_pauses_then_resumes_at_once_without_losing_a_word(tmp_path, blip):
    o = run_timeline(Timeline(clips=[ASK, barge_in(2.0, blip, "")],
                              replies=[{"text": FOUR_POINTS, "chunk_delay_ms": 30}]), tmp_path)
    (reply,) = o.replies.values()
    assert reply.outcome == ev.COMPLETED and reply.delivered_text == reply.generated_text == FOUR_POINTS
    (paused,), (resumed,) = o.of_type(ev.SPEECH_PAUSED), o.of_type(ev.SPEECH_RESUMED)
    assert resumed.body.reason == "no speech followed"
    buffer = o.device.buffer
    (pause,), (resume,) = buffer.pauses, buffer.resumes
    onset = o.clip_onsets()[1]
    assert 0 <= pause - onset <= 80 * RATE // 1000  # paused on its first frames
    assert resume - onset <= (TENTATIVE_S + 0.05) * RATE  # and resumed as soon as SPEAKING failed to follow
    assert not np.any(o.played[pause:resume])
    # every word played once, whole, in order: the pause only inserted silence
    assert [(w.word.word, n) for w, n in o.tts.heard(o.played)] == [
        (w, o.tts.word_samples) for w in FOUR_POINTS.split()]
    assert o.stt.transcribed == ["three_points.wav"]  # nothing to transcribe: no utterance


def test_a_voiced_barge_in_is_acknowledged_from_its_first_frame_and_cuts(tmp_path):
    o = run_timeline(Timeline(clips=[ASK, barge_in(2.0, "wait.wav", "Wait.")],
                              replies=[{"text": FOUR_POINTS, "chunk_delay_ms": 30}]), tmp_path)
    (reply,) = [r for r in o.replies.values()]
    assert reply.outcome != ev.COMPLETED  # the barge-in cut the reply
    (paused,) = o.of_type(ev.SPEECH_PAUSED)
    onset = o.clip_onsets()[1]
    assert abs(paused.body.onset - onset) < FRAME  # the log names where the speech began
    # the reply went quiet within 80 ms of the onset (the VAD's SPEAKING alone took 160+)
    assert 0 <= o.device.buffer.pauses[0] - onset <= 80 * RATE // 1000
    assert not o.of_type(ev.SPEECH_RESUMED)
    assert o.stt.transcribed == ["three_points.wav", "wait.wav"]
