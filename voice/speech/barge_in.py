"""Barge-in that confirms or resumes: a pure state machine.

On speech onset while the assistant talks, the output pauses at once (the
acknowledgement). Then:
- voiced speech lasting `confirm_ms` in all confirms it (the turn is cancelled,
  the delivered prefix ends where playback paused);
- an utterance that ends sooner is judged by its words: a backchannel or
  noise ("mm-hmm", "yeah", a cough transcribed as nothing) resumes, and so
  do the assistant's own words coming back through the speaker before the
  echo canceller has converged; anything else ("stop", "wait") confirms;
- nothing decisive within `resume_ms` resumes from the paused sample.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["confirm", "resume"]

BACKCHANNELS = frozenset({
    "", "mm", "mmm", "hmm", "mhm", "mmhmm", "mm hmm", "uh huh", "uhhuh", "uh", "um", "ah", "oh", "yeah", "yes",
    "yep", "ok", "okay", "right", "sure", "i see", "aha", "huh",
    # what Whisper makes of a cough or a door on its own
    "you", "thank you", "thanks",
})


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower().replace("-", " "))


def is_backchannel(text: str) -> bool:
    return " ".join(_words(text)) in BACKCHANNELS


def is_own_echo(text: str, speaking: str) -> bool:
    """Most of what was heard is words the assistant is saying."""
    heard, own = _words(text), set(_words(speaking))
    return bool(heard) and sum(w in own for w in heard) >= 0.6 * len(heard)


@dataclass
class BargeInJudge:
    confirm_ms: float = 500.0
    resume_ms: float = 2000.0
    rate: int = 16000
    onset: int | None = None  # mic sample position of the speech that paused the output
    voiced: int = 0

    @property
    def pending(self) -> bool:
        return self.onset is not None

    def start(self, onset: int) -> None:
        self.onset, self.voiced = onset, 0

    def feed(self, samples: int, voiced: bool, position: int) -> Verdict | None:
        """One mic block while pending; `position` is the block's end."""
        if self.onset is None:
            return None
        if voiced:
            self.voiced += samples
        if self.voiced >= self.confirm_ms * self.rate / 1000:
            return self._end("confirm")
        if position - self.onset >= self.resume_ms * self.rate / 1000:
            return self._end("resume")
        return None

    def heard(self, text: str, speaking: str = "") -> Verdict | None:
        """The utterance that paused the output has been transcribed;
        `speaking` is the text of the reply being spoken."""
        if self.onset is None:
            return None
        return self._end("resume" if is_backchannel(text) or is_own_echo(text, speaking) else "confirm")

    def _end(self, verdict: Verdict) -> Verdict:
        self.onset, self.voiced = None, 0
        return verdict
