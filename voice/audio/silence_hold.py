"""Silent mic blocks held back in the audio callback and handed on together.

While the service waits, the mic carries silence and the speaker plays
none. Every 32 ms block still woke the event loop (`call_soon_threadsafe`),
went through two resamplers, the echo canceller's pass-through, the
recorder and a pipecat frame, only for the listener to see silence: about
3 % of a core of the 5 % the service cost while it waited
(benchmarks/RESULTS.md, idle CPU). So the callback keeps such blocks and
hands them on as one, at most `max_s` later.

A block is held only when nothing can depend on when it arrives:
- it is under `floor_dbfs` (RMS), and so was every mic block of the last
  `quiet_s`: the listener's sound gate is closed (it holds 1 s after sound),
  no utterance is going on or ending (the longest end-of-turn wait is 1 s),
  and the VAD and the wake-word model rest;
- the speaker played nothing over the floor for `quiet_s` either: no reply
  is playing or paused under a barge-in, and the echo canceller's tail
  (2 s after the last loud sample) is over.
The first block over the floor, on either side, is handed on at once, after
the held silence and apart from it (joined, its level would be diluted and
could keep the sound gate shut), so speech is heard exactly as soon as
before; only silence arrives late. Nothing is dropped: every sample reaches
the listener, in order, so positions and recordings are unchanged (only
when the stream stops is what is held then, at most `max_s` of silence,
never handed on).

Thread-safety: `played` is called from the output callback and `take` from
the input callback, two threads (the mic and the speaker are two streams:
voice.audio.live); the state they share is plain counters the GIL keeps
whole (a stale read only hands a block on sooner or later by one block).
"""

from __future__ import annotations

import numpy as np


class SilenceHold:
    def __init__(self, mic_rate: int, speaker_rate: int, *, floor_dbfs: float, quiet_s: float, max_s: float):
        self._floor_rms = 32768 * 10 ** (floor_dbfs / 20)
        # Samples of silence, on each side at its own rate, before holding starts.
        self._mic_needed, self._played_needed = int(quiet_s * mic_rate), int(quiet_s * speaker_rate)
        self._max = int(max_s * mic_rate)  # most mic samples held
        self._mic_quiet = 0  # mic samples since the last block over the floor
        self._played_quiet = 0  # speaker samples since the last one over the floor
        self._held: list[np.ndarray] = []
        self._held_samples = 0

    def played(self, block: np.ndarray, *, silent: bool = False) -> None:
        """A block handed to the speaker; `silent`: known to be digital
        silence, so not measured (the callback's cost while the service waits)."""
        self._played_quiet = self._played_quiet + len(block) if silent or self._under_floor(block) else 0

    def take(self, block: np.ndarray) -> list[np.ndarray]:
        """A mic block; returns the blocks to hand on now (none while it is held)."""
        quiet = self._under_floor(block)
        self._mic_quiet = self._mic_quiet + len(block) if quiet else 0
        holding = quiet and self._mic_quiet > self._mic_needed and self._played_quiet > self._played_needed
        if holding and self._held_samples + len(block) <= self._max:
            self._held.append(block)
            self._held_samples += len(block)
            return []
        held = np.concatenate(self._held) if self._held else None
        self._held, self._held_samples = [], 0
        if held is None:
            return [block]
        if quiet:  # silence after silence: one block
            return [np.concatenate([held, block])]
        return [held, block]

    def _under_floor(self, block: np.ndarray) -> bool:
        if not len(block):
            return True
        samples = block.astype(np.float32)
        return float(np.dot(samples, samples)) < self._floor_rms ** 2 * len(block)
