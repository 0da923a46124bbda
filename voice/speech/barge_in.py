"""Barge-in control: pause, confirm or resume, clear.

Speech onset while the assistant is busy (a turn running or audio queued)
pauses the speaker at once: that is the acknowledgement. It is taken on the
first frames of speech (`first_frames`, voice.speech.onset), before the
VAD has decided it is speech: such a pause is tentative, and is withdrawn
(resumed) unless the VAD reports SPEAKING within `TENTATIVE_S`. For
`REARM_S` after any resume only SPEAKING pauses. The judge
(voice.speech.judge, a pure state machine) then confirms or resumes, from
the voiced length of the utterance or, when it ends sooner, from its words;
a stop and nothing more is confirmed as soon as its words are known and the
person has paused (`stop_heard`), without waiting for the utterance's end.
A confirmed barge-in cancels the agent's turn (its cancel scope) and clears
the speaker buffer inside the device callback; the controller never touches
the pipeline: each method that confirms says so (`block`, `stop_heard`,
`Heard.interrupts`, `interrupt`), and its caller, which owns the pipeline,
then interrupts it (pipecat's `InterruptionFrame` drops queued sentences).
A resume plays on from the paused sample, losing nothing.

When the words of an utterance that cut (or paused) the reply arrive, they
also say what the person wanted (`heard()`): a stop or a backchannel asks
for nothing more and is recorded as the person's stop; anything else is a
request and becomes a turn.

The controller writes `speech/paused`, `speech/resumed`, `speech/confirmed`
and `speech/cleared` (speaker positions are those of the buffer's next pull,
which carries the request out); it never waits: every method returns within
one mic block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from voice.agent.loop import AgentLoop
from voice.audio.playback import PlaybackBuffer
from voice.log.events import Body, SpeechCleared, SpeechConfirmed, SpeechPaused, SpeechResumed
from voice.speech.judge import BargeInJudge, is_backchannel, is_own_echo, stop_intent

# (event body, turn) -> the log
Log = Callable[[Body, int | None], None]

TENTATIVE_S = 0.4  # a pause from the first frames is withdrawn unless SPEAKING follows within this
# After a pause was resumed only SPEAKING pauses, for this long: a sound that keeps coming back (the
# speaker's own echo without echo cancellation, a knocking) would otherwise make the reply stutter.
REARM_S = 2.0


@dataclass(frozen=True)
class Heard:
    """What a finished utterance turned out to be."""

    text: str
    stop: str | None  # None: a request; "stop", "backchannel" or "sound": the person's stop, not answered
    stopped_turn: int | None  # the turn it stopped, if it stopped one
    # Its words stopped the reply now (confirmed the pause, or a stop said late): the caller
    # interrupts the pipeline, so queued sentences are dropped.
    interrupts: bool = False


class BargeInController:
    def __init__(self, judge: BargeInJudge, buffer: PlaybackBuffer, agent: AgentLoop, *, log: Log,
                 stop_phrases: tuple[str, ...],
                 on_cut: Callable[[int], None] = lambda onset: None,
                 ignored: Callable[[str], None] = lambda why: None,
                 speaking_text: Callable[[], str] = lambda: ""):
        self.judge = judge
        self.buffer = buffer
        self.agent = agent
        self._log = log
        self._stop_phrases = stop_phrases
        self._on_cut = on_cut  # the running turn was cut by speech that began at this onset
        self._ignored = ignored
        self._speaking_text = speaking_text  # what the assistant is saying (an echo of it is no stop)
        self._pause_turn: int | None = None
        self._tentative = False  # the pause came from the first frames, and SPEAKING has not followed yet
        self._position = 0  # the listener's, at the last block
        self._first_frames_from = 0  # the first-frames pause is off before this position (after a resume)
        self._cut: tuple[int, int | None] | None = None  # (onset, turn) confirmed before all its words were known
        self._words_due: set[int] = set()  # onsets of utterances that ended and are being transcribed
        self._outlived: int | None = None  # onset of the utterance whose pause outlived its turn
        self._position = 0  # the mic position of the latest block: where a decision is taken

    def assistant_busy(self) -> bool:
        """A turn runs or speech is queued. A turn that waits for the person's
        answer to its question (which has played) is not busy: their words
        answer it, they do not cut it."""
        return (self.agent.busy and not self.agent.waiting_for_person) or self.buffer.pending()

    # -- from the listener, one mic block at a time --------------------------

    def first_frames(self, onset: int) -> bool:
        """The first frames of speech, from `onset`, before the VAD's SPEAKING:
        while the assistant is busy this pauses the output, tentatively."""
        if onset < self._first_frames_from:
            return False
        self._tentative = self.onset(onset)
        return self._tentative

    def onset(self, onset: int) -> bool:
        """Speech began at `onset` (the VAD says SPEAKING). While the assistant
        is busy this pauses the output (the acknowledgement) and returns True:
        the utterance is a barge-in and needs no wake word."""
        if self._tentative and self.judge.onset == onset:  # the speech that paused it, confirmed by the VAD
            self._tentative = False
            return True
        if self.judge.pending or not self.assistant_busy():
            return False
        self.judge.start(onset)
        self.buffer.request_pause()
        self._pause_turn = self.agent.current_turn
        self._log(SpeechPaused(onset=onset, at=self.buffer.position), self._pause_turn)
        return True

    def block(self, samples: int, voiced: bool, position: int, speaking: bool) -> bool:
        """One mic block while a barge-in may be pending; `speaking`: the
        utterance is still going on. True when the barge-in was confirmed
        (the caller then interrupts the pipeline)."""
        self._position = position
        onset = self.judge.onset
        words_due = speaking or onset in self._words_due
        if self._tentative:  # the judge counts voiced speech from SPEAKING on, as without the early pause
            too_late = onset is not None and position - onset >= TENTATIVE_S * self.judge.rate
            verdict = self.judge.withdraw() if too_late else None  # the VAD never called it speech
        else:
            verdict = self.judge.feed(samples, voiced, position, words_due)
        if verdict is not None:
            self._tentative = False
        if verdict == "confirm" and onset is not None:
            self._cut = (onset, self._pause_turn)  # its words, once heard, say whether it asked for more
        elif verdict == "resume":
            self._ignored("a sound paused the reply and no speech followed; the reply went on")
        return self._settle(verdict, onset, "voiced speech" if verdict == "confirm" else "no speech followed")

    def deciding(self, onset: int) -> bool:
        """The reply is paused for the utterance that began at `onset`, and
        neither confirmed nor resumed yet: its words are to decide."""
        return self.judge.pending and self.judge.onset == onset and not self._tentative

    def stop_heard(self, onset: int, text: str) -> bool:
        """The words so far of the utterance that paused the reply, after a
        pause (voice.speech.turn_end.TurnEndTracker.stop_heard): a stop and
        nothing more confirms the barge-in now, so the turn's model stream
        and tools stop with the speaker. Words that may yet resume the reply
        (a backchannel such as "thanks", the assistant's own echo) are left
        to the utterance's end, as is anything said after them. True when
        confirmed (the caller interrupts the pipeline)."""
        if not self.deciding(onset) or not stop_intent(text, self._stop_phrases):
            return False
        if is_backchannel(text) or is_own_echo(text, self._speaking_text()):
            return False
        self._cut = (onset, self._pause_turn)  # the utterance's words, once all heard, say what it asked for
        return self._settle(self.judge.heard(text), onset, f"heard {text!r}, a stop")

    def turn_ending(self, turn: int) -> None:
        """The turn is about to log its end (completed, failed, or cut by
        `voice ctl cancel`): a pause of its reply still deciding ends first,
        so that the log never resumes a turn that has ended and the next
        reply is not left paused. The utterance's words, when they come, have
        no reply to cut and are heard as a request of their own."""
        if not self.judge.pending or self._pause_turn != turn:
            return
        onset, self._tentative = self.judge.onset, False
        self._settle(self.judge.withdraw(), onset, "the turn ended")
        self._outlived = onset

    def utterance_ended(self, onset: int) -> None:
        """The utterance that began at `onset` ended; its words are on their way."""
        self._words_due.add(onset)

    # -- the utterance's words -----------------------------------------------

    def heard(self, text: str, onset: int, doubtful: bool, speaking_text: str) -> Heard | None:
        """The words of the utterance that began at `onset` (possibly none);
        `speaking_text` is what the assistant is saying. None when it asks
        for nothing at all (a sound, a backchannel or the assistant's own
        echo that only paused the reply, which then went on)."""
        self._words_due.discard(onset)
        if onset == self._outlived:  # its pause ended with the turn: a request only if it asks for something
            self._outlived = None
            if not text or doubtful or is_backchannel(text) or is_own_echo(text, speaking_text) \
                    or stop_intent(text, self._stop_phrases):
                self._ignored(f"{text!r} over a reply that has since ended" if text else "a sound with no words")
                return None
            return Heard(text, None, None)
        pending = self.judge.pending and onset == self.judge.onset
        cut_by_length = self._cut is not None and self._cut[0] == onset
        said = text
        # A hum or a cough Whisper made words of ("and then", "but") is a sound. Never a stop
        # phrase: a short "Stop." the echo canceller thinned out can come back doubtful, and
        # is still the person's stop.
        if (pending or cut_by_length) and doubtful and not stop_intent(text, self._stop_phrases):
            self._ignored(f"heard {text!r} over the reply, too unsure to be words")
            said = ""
        interrupts = False
        if pending:  # it ended before the judge decided: its words decide
            cut_turn = self._pause_turn
            interrupts = self._judge_words(said, speaking_text)
            if interrupts is None:
                return None
        elif cut_by_length:
            cut_turn, self._cut = self._cut[1], None
        else:
            cut_turn = None
        cut = pending or cut_by_length
        if not said and not cut:
            self._ignored("a sound with no words")
            return None
        if not said:  # it stopped the reply by its length, and asked for nothing: recorded as such
            return Heard(text, "sound", cut_turn, interrupts)
        stop = "stop" if stop_intent(said, self._stop_phrases) else None
        if stop is None and cut and is_backchannel(said):
            stop = "backchannel"  # it cut the reply by its length; its words ask for nothing
        if stop is not None and not cut and self.assistant_busy():
            # a stop said just as the assistant started: it stops it all the same
            cut_turn = self.agent.current_turn
            if self.agent.busy:
                self._on_cut(onset)
            self.interrupt(onset)
            interrupts = True
        return Heard(said, stop, cut_turn, interrupts)

    def interrupt(self, onset: int | None = None) -> bool:
        """The barge-in protocol without the speech (a stop said late, `voice
        ctl cancel`): cancel the turn and clear the buffer; the caller then
        interrupts the pipeline (queued speech is dropped). True when a turn
        was running."""
        turn, busy = self.agent.current_turn, self.assistant_busy()
        cancelled = self.agent.cancel()
        self.buffer.request_clear()
        if busy:
            self._log(SpeechCleared(at=self.buffer.position, onset=onset), turn)
        return cancelled

    # -- internals -------------------------------------------------------------

    def _judge_words(self, text: str, speaking_text: str) -> bool | None:
        """The pending barge-in decided by its words: None when they were a
        backchannel or the assistant's own echo (the reply goes on), else
        whether they confirmed it (the pipeline is to be interrupted)."""
        onset = self.judge.onset
        verdict = self.judge.heard(text, speaking_text)
        confirmed = self._settle(verdict, onset, f"heard {text!r}")
        if verdict == "resume":
            what = "a sound with no words" if not text else f"{text!r}, " + (
                "a backchannel," if is_backchannel(text) else "the assistant's own voice (echo),")
            self._ignored(f"{what} over the reply; the reply went on")
            return None
        return confirmed

    def _settle(self, verdict: str | None, onset: int | None, reason: str) -> bool:
        if verdict is None or onset is None:
            return False
        if verdict == "resume":
            self._first_frames_from = self._position + int(REARM_S * self.judge.rate)
            self.buffer.request_resume()
            self._log(SpeechResumed(onset=onset, reason=reason, at=self.buffer.position), self._pause_turn)
            return False
        if self.agent.busy:
            self._on_cut(onset)
        self._log(SpeechConfirmed(onset=onset, at=self._position, reason=reason), self._pause_turn)
        self.agent.cancel()
        self.buffer.request_clear()
        self._log(SpeechCleared(at=self.buffer.position, onset=onset), self._pause_turn)
        self.buffer.request_resume()  # the clear comes first in the same pull: nothing old plays
        return True
