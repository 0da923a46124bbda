"""End of turn (voice.speech.turn_end): a complete request ends the turn
after a short silence with its words already known; anything else waits
the VAD's full silence; "Stop. Tell me something else instead." is never
split. The rule itself, the tracker block by block, the real pipeline on a
timeline, and real Whisper on real human read speech."""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from timeline import Timeline, at, barge_in, default_config, run_timeline
from voice.settings import Settings
from voice.log import events as ev
from voice.speech.judge import STOP_PHRASES
from voice.speech.stt import Transcript
from voice.speech.turn_end import OVER_REPLY_END_S, OVER_REPLY_TAIL_S, TurnEndTracker, complete, decide
from voice.settings import TurnEndSettings

RATE = 16000
BLOCK = 320


@pytest.mark.parametrize("text", ["What time is it?", "Set a timer for ten seconds.", "Go forward ten meters.",
                                  "Stop. Tell me something else instead.", "Tell me about London!"])
def test_a_finished_request_is_complete(text):
    assert complete(text, STOP_PHRASES)


@pytest.mark.parametrize("text", [
    "Stop.", "Wait.", "Stop. Wait.", "Okay, never mind.", "Go forward,", "Go forward.",  # too short / stop words
    "Turn the lights on and.", "Tell me about the.", "Add a note to", "Ask not what your country...", "",
])
def test_an_unfinished_or_stop_only_utterance_is_not(text):
    assert not complete(text, STOP_PHRASES)


def test_decide_needs_the_transcript_and_the_short_silence():
    s = TurnEndSettings(end_s=0.45)
    assert not decide(None, 1.0, s)  # words not known yet: the VAD decides
    assert not decide("What time is it?", 0.44, s)
    assert decide("What time is it?", 0.45, s)
    assert not decide("What time is it?", 1.0, TurnEndSettings(enabled=False))


class _Job:
    def __init__(self, text: str):
        self.text, self.ready = text, False

    def done(self):
        return self.ready

    def cancelled(self):
        return False

    def exception(self):
        return None

    def result(self):
        return Transcript(self.text, 0.1)

    def add_done_callback(self, fn):
        pass


def _feed(tracker: TurnEndTracker, utterance: bytearray, voiced: bool, blocks: int = 1) -> bool:
    ended = False
    for _ in range(blocks):
        utterance += bytes(BLOCK * 2)
        ended = tracker.block(utterance, BLOCK, voiced, may_speculate=True)
    return ended


def test_the_tracker_speculates_at_a_pause_and_ends_a_complete_request_early():
    jobs: list[_Job] = []
    texts = iter(["What time is it?"])
    tracker = TurnEndTracker(TurnEndSettings(speculate_s=0.04, end_s=0.1),
                             lambda audio: jobs.append(_Job(next(texts))) or jobs[-1], RATE)
    utterance = bytearray()
    assert not _feed(tracker, utterance, voiced=True, blocks=20)
    assert not _feed(tracker, utterance, voiced=False, blocks=2) and len(jobs) == 1  # 40 ms: speculation starts
    assert not _feed(tracker, utterance, voiced=False, blocks=5)  # not back yet
    jobs[0].ready = True
    assert _feed(tracker, utterance, voiced=False)  # known, complete, 160 ms of silence
    assert tracker.transcript().text == "What time is it?" and len(jobs) == 1


def test_speech_after_the_speculated_audio_makes_its_transcript_stale():
    jobs: list[_Job] = []
    texts = iter(["Go forward.", "Go forward ten meters."])
    tracker = TurnEndTracker(TurnEndSettings(speculate_s=0.04, end_s=0.1, min_words=2),
                             lambda audio: jobs.append(_Job(next(texts))) or jobs[-1], RATE)
    utterance = bytearray()
    _feed(tracker, utterance, voiced=True, blocks=20)
    _feed(tracker, utterance, voiced=False, blocks=2)
    assert len(jobs) == 1
    _feed(tracker, utterance, voiced=True, blocks=10)  # the person goes on before it returns
    jobs[0].ready = True
    assert not _feed(tracker, utterance, voiced=True)
    assert tracker.transcript() is None and tracker.pending() is None  # never the final words
    assert not _feed(tracker, utterance, voiced=False, blocks=2)
    assert len(jobs) == 2  # the whole utterance so far, again
    jobs[1].ready = True
    assert _feed(tracker, utterance, voiced=False, blocks=3)
    assert tracker.transcript().text == "Go forward ten meters."


def test_no_speculation_while_the_assistant_speaks():
    jobs = []
    tracker = TurnEndTracker(TurnEndSettings(speculate_s=0.04), lambda audio: jobs.append(1), RATE)
    utterance = bytearray(bytes(BLOCK * 40))
    for _ in range(10):
        tracker.block(utterance, BLOCK, False, may_speculate=False)
    assert not jobs


def test_words_begun_over_the_reply_keep_more_of_the_silence_after_them():
    """The release of the "p" in "Stop." comes ~100 ms after Silero's last
    voiced frame: an utterance that began over the reply is recognised up to
    OVER_REPLY_TAIL_S after it (and never speculated on before that), one
    that did not up to speculate_s."""
    audio: list[np.ndarray] = []
    tracker = TurnEndTracker(TurnEndSettings(speculate_s=0.04), lambda a: audio.append(a) or _Job("Stop."), RATE)
    for over_reply, tail_s in ((False, 0.04), (True, OVER_REPLY_TAIL_S)):
        tracker.reset(over_reply=over_reply)
        audio.clear()
        utterance = bytearray()
        _feed(tracker, utterance, voiced=True, blocks=10)
        _feed(tracker, utterance, voiced=False, blocks=round(tail_s * RATE / BLOCK) - 1)
        assert not audio  # not yet: the tail is not all there
        _feed(tracker, utterance, voiced=False, blocks=30)
        voiced_s = 10 * BLOCK / RATE
        assert len(audio) == 1 and len(audio[0]) / RATE == pytest.approx(voiced_s + tail_s, abs=1 / RATE)
        assert len(tracker.speech(utterance)) == 2 * len(audio[0])  # the final recognition: the same audio


def test_words_begun_over_the_reply_stay_open_for_a_second_of_silence():
    """The VAD's own end (0.6 s) is held off for an utterance begun over the
    reply until OVER_REPLY_END_S; a voiced block restarts the count."""
    tracker = TurnEndTracker(TurnEndSettings(), lambda a: _Job("Stop."), RATE)
    for over_reply in (False, True):
        tracker.reset(over_reply=over_reply)
        utterance = bytearray()
        _feed(tracker, utterance, voiced=True, blocks=10)
        assert tracker.holds_open() == over_reply
        _feed(tracker, utterance, voiced=False, blocks=round(0.6 * RATE / BLOCK))
        assert tracker.holds_open() == over_reply
        _feed(tracker, utterance, voiced=True, blocks=1)
        _feed(tracker, utterance, voiced=False, blocks=round(OVER_REPLY_END_S * RATE / BLOCK) - 1)
        assert tracker.holds_open() == over_reply
        _feed(tracker, utterance, voiced=False, blocks=1)
        assert not tracker.holds_open()


def test_a_stop_over_the_reply_is_heard_after_a_requests_pause_and_nothing_else_is():
    """Over the reply the words so far decide a stop once the person has
    paused `end_s` (a complete request's pause), not the OVER_REPLY_END_S
    the utterance itself waits; words that are more than a stop, words not
    begun over the reply and stale words never do (issue 27, point 4)."""
    settings = TurnEndSettings()
    pause = math.ceil(settings.end_s * RATE / BLOCK)  # blocks of silence
    for text, over_reply, heard in (("Stop!", True, "Stop!"), ("Okay, stop please.", True, "Okay, stop please."),
                                    ("What?", True, None), ("Stop. Tell me more.", True, None),
                                    ("Stop!", False, None)):
        jobs: list[_Job] = []
        tracker = TurnEndTracker(settings, lambda audio: jobs.append(_Job(text)) or jobs[-1], RATE, STOP_PHRASES)
        tracker.reset(over_reply=over_reply)
        utterance = bytearray()
        _feed(tracker, utterance, voiced=True, blocks=10)
        _feed(tracker, utterance, voiced=False, blocks=round(OVER_REPLY_TAIL_S * RATE / BLOCK))
        assert len(jobs) == 1, text  # the words so far are recognised over the (paused) reply
        jobs[0].ready = True
        _feed(tracker, utterance, voiced=False, blocks=pause - round(OVER_REPLY_TAIL_S * RATE / BLOCK) - 1)
        assert tracker.stop_heard() is None, text  # not yet: the pause is shorter than a request's
        _feed(tracker, utterance, voiced=False)
        assert tracker.stop_heard() == heard, text
        assert tracker.holds_open() == over_reply  # the utterance still waits the second, for more words
        if heard:
            _feed(tracker, utterance, voiced=True)  # the person goes on: the words so far are stale
            assert tracker.stop_heard() is None


# -- the real pipeline on a timeline (fake recogniser, real VAD) -------------


def test_a_complete_request_ends_early_with_its_words_already_known(tmp_path):
    """The speculation's transcript is the final one: no recognition is
    left after the end of turn, and the turn ends earlier than the VAD's
    full silence would end it."""
    def run(enabled: bool, sub: str):
        config = default_config()
        config["turn_end"]["enabled"] = enabled
        return run_timeline(Timeline(clips=[at(0.5, "what_time.wav", "What time is it?", compute_s=0.1)],
                                     replies=[{"text": "It is noon."}]), tmp_path / sub, config)

    early, late = run(True, "early"), run(False, "late")
    (e,), (l,) = early.turns, late.turns
    assert e.user_text == l.user_text == "What time is it?"
    assert e.stt_s == 0.0 and early.stt.transcribed == ["what_time.wav"]  # one recognition, during the pause
    assert l.stt_s == pytest.approx(0.1)
    saved = (l.utterance_end - e.utterance_end) / RATE
    assert 0.1 <= saved <= 0.25, saved  # stop_secs 0.6 against end_s 0.45, to the VAD frame
    assert early.replies[1].outcome == ev.COMPLETED


def test_stop_then_a_request_is_one_turn_even_with_early_ends(tmp_path):
    """"Stop. Tell me something else instead." over a reply: the pause
    after "Stop." does not end the turn ("Stop." alone is never complete),
    so the stop intent path hears the whole of it and answers it."""
    o = run_timeline(Timeline(
        clips=[at(0.5, "three_points.wav", "Give me three points about the sea."),
               barge_in(1.2, "stop.wav", "Stop. Tell me something else instead.")],
        replies=[{"text": "First, the sea is deep. Second, it is wide. Third, it is old.", "chunk_delay_ms": 30},
                 {"text": "Something else."}],
    ), tmp_path)
    users = [e.body.content for e in o.of_type(ev.USER_MESSAGE)]
    assert users == ["Give me three points about the sea.", "Stop. Tell me something else instead."]
    assert not o.of_type(ev.USER_STOP)


# -- real Whisper on real human speech ---------------------------------------


@pytest.fixture(scope="module")
def turn_end_bench():
    # benchmarks/ on the path only for this import: its llm_server.py would shadow the tests' own
    bench = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, bench)
    try:
        import turn_end
    finally:
        sys.path.remove(bench)
    return turn_end


@pytest.mark.slow  # Whisper recognises each clip
@pytest.mark.parametrize("name", ["sonnet_l01_l02.wav", "sonnet_l03_l04.wav", "sonnet_l08.wav", "stop.wav",
                                  "cmu_go_forward.wav", "what_time.wav"])
def test_real_speech_with_mid_sentence_pauses_is_one_turn(turn_end_bench, name):
    """Real read speech pauses 0.32-0.42 s after a clause Whisper writes as
    a sentence ("From fairest creatures we desire increase."): one utterance
    all the same, even if recognition took no time at all (the case most
    prone to split). A clip without such a pause ends early."""
    from voice.config import load_config
    from voice.speech.builder import loaded_once, vad_analyzer
    from voice.speech.settings import VoiceSettings
    from voice.speech.stt import WhisperEngine

    settings = VoiceSettings.from_settings(Settings.from_config(load_config(None)))
    vad = vad_analyzer(settings.vad)
    vad.set_sample_rate(RATE)
    clip = next(c for c in turn_end_bench.clips() if c["name"] == name)
    row = turn_end_bench.run_clip(clip, loaded_once(WhisperEngine, "tiny.en"), settings.turn_end, vad,
                                  settings.barge_in.stop_phrases, latency_s=0.0)
    assert row["utterances"] == 1, row["ends"]
    if name in ("cmu_go_forward.wav", "what_time.wav"):
        assert row["ends"][0]["early"] and row["stt_after_ms"] == 0
