"""End of turn: when the person has finished speaking, and what they said.

The VAD alone ends an utterance after `stop_secs` (0.6 s) of silence, then
Whisper transcribes it from scratch: two thirds of the reply's latency was
spent there, after the person had stopped. Instead, at a short pause (no
voiced block for `speculate_s`) the utterance so far is transcribed in the
background (speculation). When that transcript is a complete request and
the pause has lasted `end_s`, the turn ends at once and the transcript is
the final one: no recognition is left after the end of turn. An incomplete
transcript ("Go forward,", "Stop.") waits the VAD's full silence (words
begun over the reply: `OVER_REPLY_END_S`); if the person speaks on, the
speculative transcript is stale and dropped. Over the paused reply the
words so far are recognised too: when they are a stop and nothing more and
the pause has lasted `end_s`, the barge-in is decided by them at once
(`stop_heard`), while the utterance itself stays open the full second in
case a request follows ("Stop. Tell me something else instead.").

Every recognition of an utterance, speculative or final, is of the same
audio: up to its last voiced block and `speculate_s` of the silence after
it (`TurnEndTracker.speech`); `OVER_REPLY_TAIL_S` after it for one that
began over the assistant's speech. Which of the two gave the words depends on
how fast the machine was; the words themselves then do not, so a recorded
session replays to the same transcript on any machine and under any load.

`complete` and `decide` are the pure rules; `TurnEndTracker` keeps the state
of one utterance for ListenProcessor, block by block, and never blocks: the
recognition runs in the executor and is looked at on the next block.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from voice.settings import TurnEndSettings
from voice.speech.judge import stop_intent
from voice.speech.stt import Transcript

# A complete request ends a sentence. These last words say the speaker is
# not done, whatever Whisper's punctuation ("Turn the lights on and.").
TRAILING = frozenset(
    "a an the and or but so because if then to of for with in on at by from into about than that which who "
    "my your our their his her its is are was were be um uh er like".split())
# Fillers that carry no request; an utterance of only these (and stop phrases)
# is not a request of its own: "Stop." is often followed by one.
FILLERS = frozenset("okay ok please no yes yeah oh so well hey um uh er hmm mm".split())
WORD = re.compile(r"[a-z0-9']+")

# Words said over the reply are mostly short commands ending in a stop
# consonant ("stop", "wait", "quit"): Silero calls the silent closure before
# its release unvoiced, and cut 50 ms after the vowel, Whisper hears "Stop."
# as "So", "All" or nothing. Such words are speculated on only after this much
# silence, well inside the `end_s` a stop waits, so keeping more of it costs
# the stop's decision no time.
OVER_REPLY_TAIL_S = 0.2
# And they are often followed by more after a breath: "Stop. Tell me something
# else instead." has 0.5-0.6 s between Silero's last voiced frame of "Stop"
# and its first of "Tell", at the edge of the VAD's 0.6 s, so whether it was
# one turn or a stop and then a request depended on where the 32 ms frames
# fell. Such an utterance ends after this much silence instead. The reply is
# already paused, so the person hears no difference; a cough's pause resumes
# this much later. Only the utterance waits it: a stop and nothing more is
# decided after `end_s` (TurnEndTracker.stop_heard), so the turn it cuts
# (its model stream, its tools) does not run on for that second.
OVER_REPLY_END_S = 1.0


def complete(text: str, stop_phrases: tuple[str, ...] = ()) -> bool:
    """Whether a transcript reads as a finished request: it ends a sentence
    (. ? !), has at least three words (see `TurnEndSettings.min_words`), its
    last word does not leave it hanging, and it is not only stop phrases and
    fillers (those are decided by the VAD's full silence)."""
    return _complete(text, stop_phrases, TurnEndSettings().min_words)


def _complete(text: str, stop_phrases: tuple[str, ...], min_words: int) -> bool:
    text = text.strip()
    if not text or text.endswith("...") or text[-1] not in ".?!":
        return False
    words = WORD.findall(text.lower())
    if len(words) < min_words or words[-1] in TRAILING:
        return False
    rest = " ".join(w for w in words if w not in FILLERS)
    for phrase in sorted(stop_phrases, key=len, reverse=True):
        rest = re.sub(rf"\b{re.escape(phrase.lower())}\b", " ", rest)
    return bool(rest.strip())


def decide(transcript: str | None, silence_s: float, settings: TurnEndSettings,
           stop_phrases: tuple[str, ...] = ()) -> bool:
    """End the turn now? Only a known, complete transcript after `end_s` of
    silence; everything else waits for the VAD's own end."""
    return (settings.enabled and transcript is not None and silence_s >= settings.end_s
            and _complete(transcript, stop_phrases, settings.min_words))


@dataclass
class _Speculation:
    covers: int  # bytes of the utterance it transcribed
    job: asyncio.Future


class TurnEndTracker:
    """One utterance's speculation and early end, fed block by block.

    `start_job(audio)` starts a recognition and returns its future (the
    executor); the tracker looks at it on later blocks. A result is *valid*
    when no voiced block came after the audio it covered: then it is the
    transcript of the whole utterance.
    """

    def __init__(self, settings: TurnEndSettings, start_job: Callable[[np.ndarray], asyncio.Future],
                 rate: int, stop_phrases: tuple[str, ...] = ()):
        self.settings = settings
        self._start_job = start_job
        self._rate = rate
        self._stop_phrases = stop_phrases
        self.speculations = self.used = 0  # over the session: recognitions started, and those that gave the words
        self.reset()

    def reset(self, over_reply: bool = False) -> None:
        """A new utterance; `over_reply`: it began while the assistant spoke."""
        tail_s = max(self.settings.speculate_s, OVER_REPLY_TAIL_S) if over_reply else self.settings.speculate_s
        self._over_reply = over_reply
        self._tail = 2 * max(1, int(tail_s * self._rate))  # bytes of silence kept after the speech
        self._silent = 0  # samples since the last voiced block
        self._voiced_to = 0  # bytes of the utterance up to the end of its last voiced block
        self._spec: _Speculation | None = None
        self._result: tuple[int, Transcript] | None = None  # (bytes covered, transcript)
        self.skipped = 0  # bytes at the utterance's start that no recognition is of (a wake word said in it)
        self.started = 0  # speculations started for this utterance (the benchmark counts them)

    def block(self, utterance: bytearray, samples: int, voiced: bool, may_speculate: bool, skip: int = 0) -> bool:
        """After `utterance` grew by one block: True to end the turn now.
        `skip`: bytes at its start not to recognise; when it changes (the
        wake word was just found in the utterance), what was recognised of
        the audio before is let go: its words are not the request's."""
        if skip != self.skipped:
            self._let_go()
            self._result, self.skipped = None, skip
        if voiced:
            self._silent = 0
            self._voiced_to = len(utterance)
        else:
            self._silent += samples
        silence_s = self._silent / self._rate
        spec = self._spec
        if spec is not None and spec.job.done():
            self._spec = None
            if not spec.job.cancelled() and spec.job.exception() is None:
                self._result = (spec.covers, spec.job.result())
        if (self._spec is None and may_speculate and self.settings.enabled and not voiced
                and 2 * self._silent >= self._tail and not self._covered()):
            speech = self.speech(utterance)
            audio = np.frombuffer(speech, np.int16)[self.skipped // 2:].astype(np.float32) / 32768.0
            self._spec = _Speculation(len(speech), self._start_job(audio))
            self.started += 1
            self.speculations += 1
        transcript = self.transcript()
        return decide(transcript.text if transcript else None, silence_s, self.settings, self._stop_phrases)

    def stop_heard(self) -> str | None:
        """Over the reply: the words so far, when they are a stop and nothing
        more (`stop_intent`) and the person has paused `end_s`, as long as a
        complete request's pause; None otherwise. The barge-in is decided by
        them now, not when the utterance ends `OVER_REPLY_END_S` later."""
        transcript = self.transcript()
        if not self._over_reply or transcript is None or self._silent < self.settings.end_s * self._rate:
            return None
        return transcript.text if stop_intent(transcript.text, self._stop_phrases) else None

    def holds_open(self) -> bool:
        """The VAD has heard enough silence to end the utterance; keep it
        open anyway? Yes for one begun over the reply, until
        `OVER_REPLY_END_S` of silence."""
        return self._over_reply and self._silent < OVER_REPLY_END_S * self._rate

    def speech(self, utterance: bytearray) -> bytes:
        """The audio any recognition of this utterance is of: its voiced
        blocks and `speculate_s` (over the reply `OVER_REPLY_TAIL_S`) of the
        silence after them (not the VAD's whole closing silence, which a
        speculation never has)."""
        return bytes(utterance[: self._voiced_to + self._tail])

    def _covered(self) -> bool:
        """A valid transcript, or one on its way, already covers every voiced block."""
        covers = self._spec.covers if self._spec else self._result[0] if self._result else -1
        return covers >= self._voiced_to

    def transcript(self) -> Transcript | None:
        """The speculative transcript of the whole utterance so far, if valid."""
        if self._result is not None and self._result[0] >= self._voiced_to:
            return self._result[1]
        return None

    def complete_request(self) -> str | None:
        """The speculative words, when they are a complete request: what the
        model may start on before the turn ends (voice.agent.preempt). Not on
        unfinished words: those would mostly be wasted calls."""
        transcript = self.transcript()
        if transcript is None or transcript.doubtful:
            return None
        text = transcript.text.strip()
        return text if _complete(text, self._stop_phrases, self.settings.min_words) else None

    def pending(self) -> asyncio.Future | None:
        """A valid speculation still running (the final transcript may wait
        for it rather than start again)."""
        if self._spec is not None and self._spec.covers >= self._voiced_to:
            return self._spec.job
        return None

    def final(self) -> tuple[Transcript | None, asyncio.Future | None]:
        """At the end of the turn: the transcript, or the job that will give
        it, when a speculation covers the whole utterance."""
        transcript, pending = self.transcript(), self.pending()
        if transcript is not None or pending is not None:
            self.used += 1
        return transcript, pending

    def abandon(self) -> None:
        """The utterance is over or dropped: a running job's result is never
        used (the thread finishes on its own; its outcome is collected)."""
        self._let_go()
        self.reset()

    def _let_go(self) -> None:
        if self._spec is not None:
            self._spec.job.add_done_callback(_collect)
            self._spec = None


def _collect(job: asyncio.Future) -> None:
    if not job.cancelled():
        job.exception()
