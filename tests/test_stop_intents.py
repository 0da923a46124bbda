"""What the words of an utterance over the assistant ask for (issue #12):
the stop-intent and backchannel rules, the default phrase list the config
documents, and Whisper's doubtful words on a hum. The end-to-end checks are
the replay scenarios (test_voice_replay.py) and the live test."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from voice.speech.judge import STOP_PHRASES, BargeInJudge, is_backchannel, stop_intent

ROOT = Path(__file__).resolve().parents[1]
AUDIO = ROOT / "tests" / "fixtures" / "audio"


@pytest.mark.parametrize("text", ["Stop.", "Stop!", "stop, stop", "Wait.", "Quiet, please.", "Never mind.",
                                  "Okay, thanks.", "That's enough.", "No, stop it.", "Okay stop", "Hold on."])
def test_only_a_stop(text):
    assert stop_intent(text)


@pytest.mark.parametrize("text", ["Stop. Tell me something else instead.", "Wait, what was that?",
                                  "Stop the timer.", "Cancel my pasta timer", "Okay.", "", "Mm-hmm.",
                                  "Thanks, and what time is it?"])
def test_a_stop_and_more_or_no_stop_at_all(text):
    assert not stop_intent(text)


def test_the_phrases_are_configurable():
    assert not stop_intent("basta")
    assert stop_intent("Basta!", ["basta"]) and not stop_intent("Stop.", ["basta"])


def test_the_config_documents_the_default_phrases():
    documented = tomllib.loads((ROOT / "config" / "voice.toml").read_text())["barge_in"]["stop_phrases"]
    assert tuple(documented) == STOP_PHRASES


@pytest.mark.parametrize("text,expected", [("M-M-M", True), ("MM", True), ("Yeah, yeah.", True), ("mm hmm", True),
                                           ("", True), ("MM them.", False), ("Stop", False), ("I see you", False),
                                           ("5, 5", False), ("1", False)])  # numbers are words, not a hum
def test_backchannels_alone_or_repeated(text, expected):
    assert is_backchannel(text) is expected


def test_the_judge_waits_for_words_on_their_way():
    """The resume timeout does not cut short words being transcribed (a
    short "stop" would otherwise play the reply on until Whisper is done),
    up to four times resume_ms."""
    judge = BargeInJudge(confirm_ms=500, resume_ms=2000)
    judge.start(0)
    assert judge.feed(320, False, 2 * 16000, words_due=True) is None
    assert judge.heard("Stop") == "confirm"
    judge.start(0)
    assert judge.feed(320, False, 8 * 16000, words_due=True) == "resume"
    judge.start(0)
    assert judge.feed(320, False, 2 * 16000) == "resume"


@pytest.mark.slow
def test_whisper_words_for_a_hum_are_doubtful_and_real_ones_are_not():
    from voice.audio.wav import read_mono16k
    from voice.speech.stt import WhisperEngine

    stt = WhisperEngine("base", 2)

    def heard(name: str, skip: int = 0):
        x = read_mono16k(AUDIO / name)[skip:].astype(np.float32) / 32768
        return stt.transcribe(x)

    hum = heard("mm_hmm.wav", skip=3000)  # cut as the VAD may cut it: Whisper says "and then"
    assert hum.text and hum.doubtful, hum
    cough = heard("cough.wav", skip=3000)  # Whisper says "but"
    assert cough.text and cough.doubtful, cough
    for name in ("stop_only.wav", "wait.wav", "stop.wav", "what_time.wav", "okay_nabu.wav", "add_note.wav"):
        said = heard(name)
        assert said.text and not said.doubtful, (name, said)
