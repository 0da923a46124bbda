"""Whom the person's speech is for: the listener's part that asks the listen
gate (voice.audio.listening.ListenGate, a pure state machine).

- The wake word: its detector runs on a block only while the mic carries
  sound (voice.speech.vad_gate.SoundGate), over the listener's pre-roll
  first when the sound starts again (from a place on the model's grid, so
  the places it can fire at do not move with block sizes), so the model's
  context is the room's, not the last sound's; a detection is `listen/wake`
  and opens the gate.
- The conversation window: when the assistant stops being busy the gate
  opens its follow-up window (`listen/window`).
- A finished utterance: for the assistant, the wake word alone (the request
  is still to come), or not addressed (`-v` says so); whether the VAD is
  needed at all outside an utterance (`expects_speech`).

Without a gate (a session built with no [listen]) every utterance is for
the assistant and no wake word is listened for.
"""

from __future__ import annotations

from collections.abc import Callable

from voice.audio.device import MIC_RATE
from voice.audio.listening import ListenGate
from voice.audio.wakeword import WakeWordDetector
from voice.log.events import Body, ListenWake, ListenWindow
from voice.speech.listener import Addressed, Ignored, Listener, WakeAlone

# (event body, turn) -> the log (voice.speech.speech_log.SpeechLog.speech)
Log = Callable[[Body, int | None], None]


class Addressing:
    def __init__(self, gate: ListenGate | None, wake: WakeWordDetector | None, listener: Listener, *, log: Log,
                 transcript: Callable[[str], None], aside: Callable[[str], None] | None = None):
        self.gate = gate  # which finished utterances are for the assistant
        self._wake = wake  # in "wake" mode
        self._listener = listener
        self._log = log
        self._transcript = transcript
        self._aside = aside  # -v: what was heard and not acted on
        self.runs = 0  # blocks the wake-word detector ran on
        self._wake_fed = 0  # the mic position up to which the detector has been fed

    def wake_word(self, audio: bytes, samples: int, sound: bool, reopened: bool) -> None:
        """The wake-word detector on this block, only while the mic carries
        sound (`reopened`: the sound starts again at this block)."""
        if self._wake is None or not sound:
            return
        self.runs += 1
        li = self._listener
        if reopened:
            # Over the pre-roll, from a place on the model's own grid: where the pre-roll begins is a block
            # boundary, and blocks are larger on a busy machine; a start moved by part of the grid would move
            # every place the wake word can be found at (the VAD's restart keeps its frame grid the same way).
            preroll = b"".join(li.preroll)
            start = li.position - len(preroll) // 2
            audio = (preroll + audio)[(self._wake_fed - start) % self._wake.grid * 2:]
        self._wake_fed = li.position + samples
        if not self._wake.process(audio):
            return
        wake_at = self._listener.woke(samples, behind=self._wake.behind)
        self._log(ListenWake(position=wake_at, model=self._wake.model), None)
        self.gate.on_wake(wake_at / MIC_RATE)
        self._transcript("(okay: listening)")

    def window(self, end: int, busy: bool) -> None:
        """The follow-up window opens when the assistant stops being busy."""
        if self.gate is not None and self._listener.assistant_stopped(busy):
            self.gate.on_assistant_stopped(end / MIC_RATE)
            self._log(ListenWindow(position=end), None)

    def expects_speech(self, position: int) -> bool:
        """Speech from `position` could be for the assistant, or is reported
        when not (-v): the VAD must listen."""
        return self.gate is None or self._aside is not None or self.gate.expects_speech(position / MIC_RATE)

    def accepts(self, onset: int) -> bool:
        """An utterance from `onset` is addressed to the assistant so far (its
        words may reach the model early)."""
        return self.gate is None or self.gate.accepts_utterance(onset / MIC_RATE)

    def addressed(self, audio: bytes, end: int) -> Addressed:
        """Whether the finished utterance is meant for the assistant
        (voice.speech.listener), told to the gate."""
        li = self._listener
        gated = self.gate is not None
        addressed = li.addressed(audio, end, gated=gated,
                                 accepted=gated and (li.barge_in or self.gate.accepts_utterance(li.onset / MIC_RATE)))
        if isinstance(addressed, Ignored):
            if self._aside is not None:
                self._aside(f"(ignored: {addressed.seconds:.1f} s of speech without the wake word)")
        elif isinstance(addressed, WakeAlone):
            self.gate.on_wake(end / MIC_RATE)
        elif gated:
            self.gate.consume()
        return addressed
