"""A barge-in interrupts the assistant, never the person's own words.

Found live, on a loaded machine: "Stop." ended as an utterance of its own,
the barge-in judge then confirmed it by its length (the person had gone on
with "Tell me something else instead."), and pipecat's InterruptionFrame
cancelled the recognition of "Stop." still running in the transcribe stage.
The stop was never written down, while a replay of the same recording, where
recognition costs no time, wrote it: the log depended on the machine's speed.
The utterance and its words are uninterruptible frames; these run the real
pipeline stages with the packaged Whisper on a real recording.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import pytest
from pipecat.frames.frames import InterruptionFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.tests.utils import SleepFrame, run_test

from voice.audio.wav import read_mono16k
from voice.speech.pipeline import ConverseProcessor, TranscribeProcessor, UserTextFrame, UtteranceFrame
from voice.speech.stt import WhisperEngine

AUDIO = Path(__file__).resolve().parent / "fixtures" / "audio"


@pytest.fixture(scope="module")
def stt():
    return WhisperEngine("tiny.en", 2)


def utterance(name: str) -> UtteranceFrame:
    audio = read_mono16k(AUDIO / name)
    return UtteranceFrame(audio=audio.astype(np.int16).tobytes(), start=0, end=len(audio))


@pytest.mark.anyio
async def test_an_interruption_during_recognition_keeps_the_words(stt):
    down, _ = await run_test(TranscribeProcessor(stt),
                             frames_to_send=[utterance("stop_only.wav"), SleepFrame(0.02), InterruptionFrame()])
    words = [f.text for f in down if isinstance(f, UserTextFrame)]
    assert len(words) == 1 and "stop" in words[0].lower(), down
    assert any(isinstance(f, InterruptionFrame) for f in down)  # it went on past the stage at once


@pytest.mark.anyio
async def test_words_on_their_way_to_the_session_reach_it_through_an_interruption(stt):
    converse = ConverseProcessor()
    pipeline = Pipeline([TranscribeProcessor(stt), converse])
    await run_test(pipeline, frames_to_send=[utterance("stop_only.wav"), utterance("what_time.wav"),
                                             SleepFrame(0.02), InterruptionFrame(), SleepFrame(0.8),
                                             InterruptionFrame()])
    with anyio.fail_after(5):  # what the session reads, in order, to the pipeline's end
        texts = [frame.text async for frame in converse.words]
    assert len(texts) == 2, texts
    assert "stop" in texts[0].lower() and "time" in texts[1].lower(), texts
