"""When the listener runs its VAD: only when the moment needs it.

Silero through pipecat's analyzer on every 20 ms block (one model call per
32 ms, one executor hop per block) was most of what the service cost while
it waited for speech (benchmarks/RESULTS.md, idle CPU). It is needed only
- while it is mid-decision (an utterance going on, or starting or stopping),
- while the assistant is busy (a barge-in must be heard at once), and
- when speech now could be for the assistant: in open mode always, in wake
  mode in the conversation window and after a wake word (until then only
  the wake-word detector listens),
and then only when the mic carries sound at all: a block under
`LEVEL_FLOOR_DBFS` with none over it for `HOLD_S` holds no speech worth a
model call (a cheap level gate in front of Silero).

When the VAD starts again, the analyzer is reset and first fed the
listener's pre-roll (the last half second), so speech that began just
before, the start of a request said right after the wake word, is scored as
if the VAD had been running.
"""

from __future__ import annotations

from voice.audio.device import MIC_RATE
from voice.speech.onset import level_dbfs

LEVEL_FLOOR_DBFS = -60.0  # RMS of a 20 ms block: quieter is silence or a quiet room's floor
HOLD_S = 1.0  # after a block over the floor the VAD keeps running this long


class VadGate:
    def __init__(self) -> None:
        self.running = False
        self._loud_until = -1  # stream position (samples) until which the level gate stays open

    def should_run(self, block: bytes, end: int, *, active: bool, expected: bool) -> bool:
        """For the block ending at stream position `end`: run the VAD on it?
        `active`: it must (mid-decision, or the assistant busy); `expected`:
        speech now could be for the assistant. `restarting` then says
        whether the VAD was off until now."""
        if expected and level_dbfs(block) >= LEVEL_FLOOR_DBFS:
            self._loud_until = end + int(HOLD_S * MIC_RATE)
        run = active or (expected and end <= self._loud_until)
        self.restarting = run and not self.running
        self.running = run
        return run
