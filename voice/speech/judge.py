"""Barge-in that confirms or resumes: a pure state machine.

On speech onset while the assistant talks, the output pauses at once (the
acknowledgement). Then:
- voiced speech lasting `confirm_ms` in all confirms it (the turn is cancelled,
  the delivered prefix ends where playback paused);
- an utterance that ends sooner is judged by its words: a backchannel or
  noise ("mm-hmm", "yeah", a cough transcribed as nothing) resumes, and so
  do the assistant's own words coming back through the speaker before the
  echo canceller has converged; anything else ("stop", "wait") confirms;
- nothing decisive within `resume_ms` resumes from the paused sample, unless
  the utterance's words are on their way (it is still going on, or being
  transcribed): those are waited for, up to `WORDS_WAIT` times `resume_ms`,
  so a short "stop" is never played over while Whisper works on it.

What a confirmed barge-in asks for is decided by its words too
(`stop_intent`): an utterance made only of stop phrases ("stop", "never
mind", "okay thanks") is the person's stop and nothing more, so it is not
answered; "Stop. Tell me something else instead." asks for more, and is.
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


STOP_PHRASES = (  # the default of [barge_in] stop_phrases (config/voice.toml documents it)
    "stop", "stop it", "stop talking", "stop there", "wait", "hold on", "hang on", "pause", "quiet", "be quiet",
    "hush", "shush", "shh", "silence", "shut up", "enough", "that's enough", "that will do", "never mind",
    "nevermind", "forget it", "cancel", "cancel that", "okay thanks", "ok thanks", "no thanks", "thanks",
    "thank you", "got it",
)
# Words that may come with a stop phrase without asking for anything ("okay, stop please").
STOP_FILLERS = frozenset({"okay", "ok", "oh", "please", "um", "uh", "no", "just", "now", "alright", "all", "right",
                          "hey", "so", "yeah", "sorry", "actually", "nabu"})


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower().replace("-", " ").replace("'", "").replace("\u2019", ""))


def stop_intent(text: str, phrases: tuple[str, ...] | list[str] = STOP_PHRASES) -> bool:
    """The utterance is only a stop: every word belongs to a stop phrase or is
    a filler, and at least one stop phrase is there. Longest phrases first."""
    words, wanted = _words(text), sorted({tuple(_words(p)) for p in phrases if _words(p)}, key=len, reverse=True)
    i, found = 0, False
    while i < len(words):
        match = next((p for p in wanted if tuple(words[i:i + len(p)]) == p), None)
        if match is not None:
            i, found = i + len(match), True
        elif words[i] in STOP_FILLERS:
            i += 1
        else:
            return False
    return found


# Sounds of assent, alone or repeated ("yeah yeah"; Whisper writes a hum as "M-M-M").
_ASSENT = frozenset({"m", "mm", "mmm", "hm", "hmm", "mhm", "mmhmm", "uh", "huh", "uhhuh", "um", "ah", "oh", "aha",
                     "yeah", "yes", "yep", "ok", "okay", "right", "sure"})


def is_backchannel(text: str) -> bool:
    words = _words(text)
    return " ".join(words) in BACKCHANNELS or all(w in _ASSENT for w in words)


def is_own_echo(text: str, speaking: str) -> bool:
    """Most of what was heard is words the assistant is saying."""
    heard, own = _words(text), set(_words(speaking))
    return bool(heard) and sum(w in own for w in heard) >= 0.6 * len(heard)


WORDS_WAIT = 4  # how much longer than resume_ms the judge waits for words on their way


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

    def feed(self, samples: int, voiced: bool, position: int, words_due: bool = False) -> Verdict | None:
        """One mic block while pending; `position` is the block's end;
        `words_due`: the utterance's words will come (it is not over, or it
        is being transcribed)."""
        if self.onset is None:
            return None
        if voiced:
            self.voiced += samples
        if self.voiced >= self.confirm_ms * self.rate / 1000:
            return self._end("confirm")
        waited = position - self.onset
        limit = self.resume_ms * self.rate / 1000
        if waited >= limit and (not words_due or waited >= WORDS_WAIT * limit):
            return self._end("resume")
        return None

    def heard(self, text: str, speaking: str = "") -> Verdict | None:
        """The utterance that paused the output has been transcribed;
        `speaking` is the text of the reply being spoken."""
        if self.onset is None:
            return None
        return self._end("resume" if is_backchannel(text) or is_own_echo(text, speaking) else "confirm")

    def withdraw(self) -> Verdict | None:
        """The sound that paused the output was not speech after all: resume."""
        return self._end("resume") if self.onset is not None else None

    def _end(self, verdict: Verdict) -> Verdict:
        self.onset, self.voiced = None, 0
        return verdict
