"""When the listener runs its models: only when the moment needs it.

Silero through pipecat's analyzer on every block (one model call per 32 ms,
one executor hop per block) was most of what the service cost while it
waited for speech (benchmarks/RESULTS.md, idle CPU). It is needed
- while it is mid-decision (an utterance going on, or starting or stopping),
  and otherwise only when the mic carries sound at all (`SoundGate`: a block
  under `LEVEL_FLOOR_DBFS` with none over it for `HOLD_S` holds no speech
  worth a model call) and
- the assistant is busy (a barge-in must be heard at once), or speech now
  could be for the assistant: in open mode always, in wake mode in the
  conversation window and after a wake word (until then only the wake-word
  detector listens).
The same level gate stands in front of the wake-word detector.

Whether the VAD rests never depends on how fast the machine is, in open
mode: a rest changes the model's state (it skips the silence), so a rest
that began when the assistant's turn happened to start (after Whisper, so
later on a slower machine) made a recorded session replay to other words.
Being busy only keeps it running while there is sound.

When a model starts again it is first fed the listener's pre-roll (the last
half second), so speech that began just before, the start of a request
said right after the wake word, is scored as if it had been running.

`VoiceActivity` is the VAD's part of the listener's work: the analyzer run
when `VadGate` says, restarted over the pre-roll on the frame grid it had,
and the first frames of speech (voice.speech.onset). The wake-word
detector's is voice.speech.addressing's.
"""

from __future__ import annotations

from pipecat.audio.vad.vad_analyzer import VADState

from voice.audio.device import MIC_RATE
from voice.speech.listener import Listener
from voice.speech.onset import FrameScoringSilero, OnsetDetector, level_dbfs

LEVEL_FLOOR_DBFS = -60.0  # RMS of a block: quieter is silence or a quiet room's floor
HOLD_S = 1.0  # after a block over the floor the gate stays open this long


class SoundGate:
    """Open while the mic carries sound: from a block over the floor until
    `HOLD_S` without one. `opened`: it opened at the latest block."""

    def __init__(self) -> None:
        self.open = self.opened = False
        self._loud_until = -1  # stream position (samples) until which it stays open

    def update(self, block: bytes, end: int) -> bool:
        """For the block ending at stream position `end`: is there sound?"""
        if level_dbfs(block) >= LEVEL_FLOOR_DBFS:
            self._loud_until = end + int(HOLD_S * MIC_RATE)
        was, self.open = self.open, end <= self._loud_until
        self.opened = self.open and not was
        return self.open


class VadGate:
    def __init__(self) -> None:
        self.running = self.restarting = False

    def should_run(self, sound: bool, *, deciding: bool, busy: bool, expected: bool) -> bool:
        """Run the VAD on this block? `sound`: the SoundGate is open;
        `deciding`: an utterance is going on, starting or stopping; `busy`:
        the assistant is; `expected`: speech now could be for the assistant.
        `restarting` then says whether the VAD was off until now."""
        run = deciding or (sound and (busy or expected))
        self.restarting = run and not self.running
        self.running = run
        return run


class VoiceActivity:
    """The VAD on the mic stream, block by block, for the listener (whose
    pre-roll and frame grid it restarts on)."""

    def __init__(self, vad, listener: Listener):
        self.vad = vad  # pipecat's analyzer; a FrameScoringSilero rests when VadGate says and scores frames
        self._listener = listener
        scoring = isinstance(vad, FrameScoringSilero)
        self._onsets = OnsetDetector() if scoring else None
        self._gate = VadGate() if scoring else None  # runs the VAD only when the moment needs it
        self._state = VADState.QUIET  # the VAD's, after the last block
        self.runs = 0  # blocks it ran on

    async def state(self, audio: bytes, n: int, sound: bool, *, busy: bool, expected: bool) -> VADState:
        """The VAD's state after this block, running it only when the moment
        needs it; QUIET when it is off. `busy`: the assistant is; `expected`:
        speech now could be for the assistant (VadGate.should_run)."""
        if self._gate is None:
            self.runs += 1
            return await self.vad.analyze_audio(audio)
        li = self._listener
        deciding = li.speaking or self._state != VADState.QUIET
        if not self._gate.should_run(sound, deciding=deciding, busy=busy, expected=expected):
            self._state = VADState.QUIET
            return self._state
        if self._gate.restarting:  # over the pre-roll first, on the frame grid it had
            restart = li.vad_restart()
            self.vad.restart(skipped=restart.skipped)
            self._onsets.reset()
            audio = restart.audio + audio
        li.fed_vad(n)
        self.runs += 1
        self._state = await self.vad.analyze_audio(audio)
        return self._state

    def broke_off(self) -> None:
        """The mic's audio broke off (a lost sound card, now back): the
        decision in progress is over, and the VAD starts again at the next
        block it runs on, QUIET, over what the listener kept since."""
        self._state = VADState.QUIET
        if self._gate is not None:
            self._gate.running = False
            self.vad.forget_speech()
            self._onsets.reset()

    def first_frames(self, position: int) -> int | None:
        """Where speech began, from its first frames, before the analyzer's
        SPEAKING (voice.speech.onset); None when nothing began (or the
        analyzer does not score frames). `position`: the block's end."""
        if self._onsets is None:
            return None
        return self._onsets.feed(self.vad.take_frames(), position)

    async def release(self) -> None:
        """The analyzer runs its model on a thread of its own, which outlives
        the session unless released. Idempotent."""
        await self.vad.cleanup()
