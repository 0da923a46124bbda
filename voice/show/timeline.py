"""What the picture of one turn shows, as plain data on one time axis.

Every time here is in seconds on the device's sample clock: 0 is the first
sample of the session's duplex audio stream, the microphone sample at
position p is at p / 16000, and a speaker sample at position q of the
playback buffer (PlaybackBuffer.position, at the speaker's rate) is at
q / rate. Speaker times are when samples were handed to the device; the
sound leaves the speaker `output_latency` later (0 on the replay device).

A `TurnTimeline` is filled from the log and the recording by
`voice.show.load` and drawn by `voice.show.page`; it imports nothing of
ours, so either side can change without the other. Each field's docstring
says which log event it comes from (the events the log does not carry yet
are proposed in `voice.show.load`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

MIC_RATE = 16000

#: heard: its whole audio played. cut: it was playing when the output stopped.
#: queued: synthesized, but the cut came before it played. unsaid: never
#: synthesized (the cut came first, or synthesis failed).
WordState = Literal["heard", "cut", "queued", "unsaid"]
MarkKind = Literal["pause", "confirm", "resume", "clear"]


@dataclass(frozen=True, eq=False)
class Waveform:
    """Mono int16 samples, the first one at `start_s`."""

    samples: np.ndarray
    rate: int
    start_s: float = 0.0

    @property
    def end_s(self) -> float:
        return self.start_s + len(self.samples) / self.rate

    def window(self, start_s: float, end_s: float) -> Waveform:
        """The part of the waveform between two times (clamped)."""
        lo = max(0, int(round((start_s - self.start_s) * self.rate)))
        hi = min(len(self.samples), max(lo, int(round((end_s - self.start_s) * self.rate))))
        return Waveform(self.samples[lo:hi], self.rate, self.start_s + lo / self.rate)


@dataclass(frozen=True)
class Span:
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Utterance:
    """What the person said that opened the turn (`user/message`)."""

    text: str
    start_s: float | None = None  # speech onset the listener estimated (with no pre-roll)
    end_s: float | None = None  # where the end of turn was decided


@dataclass(frozen=True)
class ReplyWord:
    """One whitespace-separated word of the reply's text. `start_s`/`end_s`
    are where its audio played (for a cut word, up to the cut); None for a
    word that never played."""

    text: str
    state: WordState
    start_s: float | None = None
    end_s: float | None = None

    @property
    def heard(self) -> bool:
        return self.state == "heard"


@dataclass(frozen=True)
class BargeInMark:
    """A barge-in decision. pause: speech onset paused the output (the
    acknowledgement); confirm/resume: the judge's verdict; clear: the
    speaker buffer was emptied (the cut). `onset_s` is the speech onset that
    started it, so `ack_ms` is how long the person spoke over the reply
    before this mark."""

    kind: MarkKind
    at_s: float
    onset_s: float | None = None
    reason: str | None = None

    @property
    def ack_ms(self) -> float | None:
        if self.onset_s is None:
            return None
        return round((self.at_s - self.onset_s) * 1000, 1)


@dataclass(frozen=True)
class ToolMark:
    """A tool call of the turn, with its result and (for a write) its receipt."""

    name: str
    arguments: str  # JSON, as the model sent it
    dispatch_s: float | None = None  # None: never dispatched (or no clock to place it)
    result_s: float | None = None
    status: str | None = None  # tool/result status: ok, error, cancelled, ABORTED_BEFORE_DISPATCH, blocked
    receipt: str | None = None  # confirmed | failed | unknown (writes only)


@dataclass(frozen=True)
class Latency:
    """The wait between the person's last word and the reply's first sound,
    as milestones on the device clock (None where unknown). Consecutive known
    milestones bound the parts: end of turn (silence until the decision),
    recognition, first token (the model), first audio (synthesis of the first
    sentence and the queue to the speaker)."""

    speech_end_s: float | None = None  # the last voiced sample of the utterance
    decided_s: float | None = None  # the end of turn was decided
    transcript_s: float | None = None  # recognition finished
    first_token_s: float | None = None  # the model's first text token arrived
    first_audio_s: float | None = None  # the reply's first sample was handed to the speaker
    # What a part's length alone would misstate, said beside its name: how long
    # recognition itself took when it began before the end of turn (speculative
    # recognition), and a replay on the virtual clock (recognition costs nothing
    # there; the model's recorded reply is held until its recorded time).
    recognition_ms: float | None = None
    speculative: bool = False
    replayed: bool = False

    NAMES = ("end of turn", "recognition", "first token", "first audio")

    def label(self, name: str) -> str:
        """A part's name as the picture shows it (`name` as parts() gives it)."""
        notes = []
        if "recognition" in name and self.speculative and self.recognition_ms is not None:
            notes.append(f"ran {self.recognition_ms:.0f} ms, begun before the end of turn")
        if self.replayed and "recognition" in name:
            notes.append("free on the replay's clock")
        if self.replayed and "first token" in name:
            notes.append("held to the recorded time")
        return name + (f" ({'; '.join(notes)})" if notes else "")

    def milestones(self) -> list[tuple[str, float | None]]:
        """(the part that ends at this milestone, its time), in order."""
        times = (self.decided_s, self.transcript_s, self.first_token_s, self.first_audio_s)
        return list(zip(self.NAMES, times))

    def parts(self) -> list[tuple[str, float, float]]:
        """(label, start, end) between consecutive known milestones; a part
        whose own milestone is unknown is merged into the next known one. A
        milestone measured a little before the previous one (two clocks
        that drift by milliseconds) makes a part of 0 s, not a negative one."""
        out: list[tuple[str, float, float]] = []
        start, pending = self.speech_end_s, []
        for name, at in self.milestones():
            pending.append(name)
            if at is None:
                continue
            if start is not None:
                at = max(at, start)
                out.append((" + ".join(pending), start, at))
            start, pending = at, []
        return out


@dataclass(frozen=True, eq=False)
class TurnTimeline:
    """Everything the picture of one turn shows."""

    turn: int
    conversation: str
    window: Span  # the stretch of the session drawn: the turn with context either side
    mic: Waveform | None = None  # the microphone as captured, before echo cancellation
    speaker: Waveform | None = None  # what the speaker played
    speech: tuple[Span, ...] = ()  # regions the VAD heard as speech
    wake_s: float | None = None  # the wake word fired
    utterance: Utterance | None = None
    reply_text: str = ""  # what the model generated, all messages of the turn
    words: tuple[ReplyWord, ...] = ()
    marks: tuple[BargeInMark, ...] = ()
    delivered: str = ""  # the delivered prefix as the log recorded it (speech/played applied)
    aborted: bool = False  # turn/end outcome "aborted": the person stopped it
    outcome: str | None = None  # turn/end outcome; None while the turn is open
    tools: tuple[ToolMark, ...] = ()
    latency: Latency = field(default_factory=Latency)
    #: what could not be taken from the log, and how the picture filled it or
    #: left it out: shown under the picture, never silently guessed
    gaps: tuple[str, ...] = ()

    @property
    def heard_words(self) -> list[ReplyWord]:
        return [w for w in self.words if w.heard]

    @property
    def unheard_words(self) -> list[ReplyWord]:
        return [w for w in self.words if not w.heard]
