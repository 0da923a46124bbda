"""The listener's decisions, one mic block at a time: a pure state machine
(no pipecat, no models, no clock), driven by `ListenProcessor`
(voice.speech.pipeline), which runs the models and passes their answers in.

It keeps the pre-roll (the audio before the VAD said SPEAKING), the
utterance's audio, where the utterance began (the first frames' onset when
they paused the reply, else `start_secs` back), the wake word's position
and the cut of the wake word off the utterance, which words the model may
start on early, and where the VAD restarts on the frame grid it had. Each
method is one decision; `position` is the mic sample position at the start
of the block being decided, and `advance` ends the block.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

PREROLL_S = 0.5  # the audio kept before the VAD said SPEAKING (the utterance begins in it)
WAKE_ALONE_S = 0.5  # a wake word this close to the end of its utterance is all it said: wait for the request
WAKE_CUT_LEAD_S = 0.2  # the cut lies this far before the wake word fired


@dataclass(frozen=True)
class Ignored:
    """The utterance is not for the assistant (no wake word)."""

    seconds: float  # its length


@dataclass(frozen=True)
class WakeAlone:
    """The utterance was only the wake word: the request is still to come."""


@dataclass(frozen=True)
class ForAssistant:
    """The utterance's audio for the assistant (the wake word cut off)."""

    audio: bytes
    skipped: int  # bytes of the utterance cut off before `audio` (Listener.addressed_from)


Addressed = Ignored | WakeAlone | ForAssistant


@dataclass(frozen=True)
class VadRestart:
    """The VAD starts again over the pre-roll, on the frame grid it had."""

    skipped: int  # samples it did not see since it last ran
    audio: bytes  # the pre-roll from the first frame boundary in it


class Listener:
    def __init__(self, rate: int, start_samples: int, preroll_samples: int, frame: int, max_lead_samples: int):
        self.rate = rate
        self._start_samples = start_samples  # the VAD's start_secs
        self._preroll_max = preroll_samples * 2  # bytes
        self._frame = frame  # the VAD's frame, in samples
        self._max_lead = max_lead_samples  # how far before SPEAKING the first frames' onset may lie
        self.position = 0  # at the start of the block being decided
        self.preroll: deque[bytes] = deque()
        self.utterance = bytearray()
        self.speaking = False
        self.onset = 0  # of the utterance, or the last one
        self.utterance_start = 0  # where its audio (with pre-roll) begins
        self.voiced_end = 0  # the end of the latest voiced block
        self.wake_at: int | None = None
        self.barge_in = False  # the utterance began over the assistant (it needs no wake word)
        self.vad_fed = 0  # the stream position up to which the VAD has been fed
        self._early_onset: int | None = None  # where the first frames of speech paused the reply
        self._busy = False  # the assistant, at the last block
        self.speculated: str | None = None  # the words an early model start answers

    # -- within a block --------------------------------------------------------

    def woke(self, samples: int, behind: int = 0) -> int:
        """The wake word fired in this block, `behind` samples before its end
        (the detector's own place for it); returns where, on the mic clock.
        Not the block's end: blocks come larger when the machine is busy (a
        held second of silence, two device blocks at once), and where the
        request is cut from (`addressed_from`) must not move with them."""
        self.wake_at = self.position + samples - max(0, min(behind, samples))
        return self.wake_at

    def vad_restart(self) -> VadRestart:
        """The VAD runs again after a rest: over the pre-roll first, from its first frame boundary."""
        preroll = b"".join(self.preroll)
        start = self.position - len(preroll) // 2
        skip = -start % self._frame
        return VadRestart(skipped=max(0, start + skip - self.vad_fed), audio=preroll[skip * 2:])

    def fed_vad(self, samples: int) -> None:
        self.vad_fed = self.position + samples

    def assistant_stopped(self, busy: bool) -> bool:
        """True when the assistant was busy at the last block and is not now (the follow-up window opens)."""
        stopped = self._busy and not busy
        self._busy = busy
        return stopped

    def heard(self, audio: bytes, voiced: bool) -> None:
        """The block joins the pre-roll (and the utterance, while one goes on)."""
        self.preroll.append(audio)
        while sum(map(len, self.preroll)) > self._preroll_max:
            self.preroll.popleft()
        if self.speaking:
            self.utterance += audio
        if voiced:
            self.voiced_end = self.position + len(audio) // 2

    def first_frames(self, onset: int, paused: bool) -> None:
        """The first frames of speech from `onset`; `paused`: they paused the reply."""
        if paused and not self.speaking:
            self._early_onset = onset

    def start_utterance(self, samples: int) -> int:
        """The VAD said SPEAKING: the utterance begins, with the pre-roll; returns its onset."""
        end = self.position + samples
        early, self._early_onset = self._early_onset, None
        if early is not None and end - early <= self._max_lead:  # the onset that paused the reply is this speech
            self.onset = early
        else:
            self.onset = max(0, end - self._start_samples)
        self.speaking = True
        self.utterance = bytearray(b"".join(self.preroll))
        self.utterance_start = end - len(self.utterance) // 2
        return self.onset

    def speculate(self, text: str | None) -> bool:
        """The words the model may start on now (None: none); True when that changed."""
        if text == self.speculated:
            return False
        self.speculated = text or None
        return True

    def end_utterance(self) -> bytearray:
        """The utterance is over; returns its audio."""
        self.speaking = False
        audio, self.utterance = self.utterance, bytearray()
        return audio

    def addressed(self, audio: bytes, end: int, *, gated: bool, accepted: bool) -> Addressed:
        """Whether the utterance's `audio` (ended at `end`) is for the
        assistant; `gated`: a listen gate decides, `accepted`: it accepts an
        utterance from this onset. The wake word is cut off by position
        (Whisper mangles "okay nabu")."""
        if not gated:
            return ForAssistant(audio, skipped=0)
        if not self.barge_in and not accepted:
            return Ignored((end - self.onset) / self.rate)
        wake_at = self.wake_at
        if (wake_at is not None and self.utterance_start <= wake_at <= end
                and end - wake_at < int(WAKE_ALONE_S * self.rate)):
            return WakeAlone()
        skipped = self.addressed_from(end)
        return ForAssistant(audio[skipped:], skipped=skipped)

    def addressed_from(self, end: int) -> int:
        """Bytes at the start of the utterance (ending at `end`) that are not
        for the assistant: up to just before a wake word said in it (0: none).
        Speculative recognition starts there too, so that its words are the
        request's, not "Okay, Nabu, ..." (voice.speech.turn_end)."""
        wake_at = self.wake_at
        if wake_at is None or not self.utterance_start <= wake_at <= end:
            return 0
        return (max(self.utterance_start, wake_at - int(WAKE_CUT_LEAD_S * self.rate)) - self.utterance_start) * 2

    def end_speculation(self, dropped: bool) -> bool:
        """The utterance is over: True when its early start is to be let go (it was dropped)."""
        let_go = dropped and self.speculated is not None
        self.speculated = None
        return let_go

    def broke_off(self) -> None:
        """The mic's audio broke off here (the sound card was lost and is
        back): what came before is not continuous with what follows, so it is
        no pre-roll for the next utterance."""
        self.preroll.clear()

    def advance(self, samples: int) -> None:
        """The block is decided."""
        self.position += samples
