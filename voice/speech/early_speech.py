"""The early start's first sentence, synthesized before the turn is committed.

An early start (voice.agent.preempt) streams the model while the end of turn
is still being decided; without this, synthesis waited for the commit, and
the first sample played a whole Piper run after it. Here the first sentence
of the early stream is cut exactly as the voice surface will cut it (the same
deltas through a `SpeakableStream`: the first clause or sentence, in its
spoken form) and synthesized at once, in the executor.

Nothing of it leaves the process before the commit: the audio is only held
here, never handed to the speaker, the log or the transcript.

- The turn that reads the early start (`EarlyStart.taken`) asks Piper for
  the same first sentence: `SpeakProcessor` takes the held job (`claim`)
  instead of starting one, so the first sample can play within one device
  block of the commit.
- The early start is dropped, or its turn speaks another first sentence:
  the audio is discarded (`drop`); a synthesis still running finishes on its
  own thread and its outcome is only collected, never used. A sentence not
  yet begun is never synthesized.

The speculation costs the CPU one sentence's synthesis while the person is
silent (an early start begins only while the assistant is); `synthesized`
and `used` count them, `dropped_s` adds up the compute time of those never
played (a replay's summary, the benchmarks).
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import dataclass

from voice.agent.preempt import EarlyStart
from voice.agent.providers.base import TextDelta, ToolCallDelta
from voice.agent.surface import UnitRef
from voice.speech.speakable import SpeakableStream
from voice.speech.tts import Synthesis, TtsEngine


@dataclass(eq=False)
class _First:
    early: EarlyStart
    text: str | None = None  # the spoken form of its first sentence, once known
    synthesis: Synthesis | None = None  # its synthesis


class EarlySpeech:
    def __init__(self, tts: TtsEngine):
        self._tts = tts
        self._held: _First | None = None
        self.synthesized = self.used = 0
        self.dropped_s = 0.0  # compute time of the syntheses never played

    async def run(self, early: EarlyStart) -> None:
        """Follow `early` (beside its `run`, in the same task group) until its
        first sentence is known, and start its synthesis. Ends when the stream
        ends, whoever ends it. Only text before the first tool call counts:
        text after a write call is held back by the turn until its receipt."""
        first = _First(early)
        self._discard(self._held)
        self._held = first
        stream = SpeakableStream()
        sentences = []
        async with aclosing(early.watch()) as deltas:
            async for delta in deltas:
                if self._held is not first:  # dropped while it streamed
                    return
                if isinstance(delta, ToolCallDelta):
                    return
                if isinstance(delta, TextDelta):
                    sentences = stream.feed(delta.text)
                    if sentences:
                        break
            else:
                if early.error is None:
                    sentences = stream.close()  # a reply of one unfinished sentence: the surface says it at the close
        if self._held is not first or not sentences or not sentences[0].text.strip():
            return
        first.text = sentences[0].text
        first.synthesis = Synthesis.start(self._tts, first.text, early=True)
        self.synthesized += 1

    def claim(self, ref: UnitRef, index: int, text: str) -> Synthesis | None:
        """The held synthesis, when this sentence is the one it is of: the
        first sentence of the first message of the turn that read the early
        start, with the same spoken text. The hold is let go either way once
        that turn's first sentence comes."""
        first = self._held
        if first is None or not first.early.taken or (ref.step, ref.attempt, ref.part, index) != (0, 0, 0, 0):
            return None
        self._held = None
        if first.synthesis is None or text != first.text:  # (one not yet begun never begins)
            self._discard(first)
            return None
        self.used += 1
        return first.synthesis

    def drop(self, early: EarlyStart) -> None:
        """`early` was dropped, or its turn is over: its audio is never used."""
        if self._held is not None and self._held.early is early:
            self._discard(self._held)
            self._held = None

    def _discard(self, first: _First | None) -> None:
        if first is not None and first.synthesis is not None:
            first.synthesis.job.add_done_callback(self._collect)

    def _collect(self, job: asyncio.Future) -> None:
        """Retrieve an abandoned job's outcome (no 'exception was never
        retrieved'); only its compute time is counted (`dropped_s`)."""
        if not job.cancelled() and job.exception() is None:
            self.dropped_s += job.result().seconds
