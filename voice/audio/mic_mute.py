"""A microphone that delivers exact digital zeros is muted, not lost.

A laptop's mute key (or a source muted in the audio server) makes the
microphone deliver exact zeros while its stream goes on calling back on
time. A microphone that is live never does that for long: even in a quiet
room its noise floor moves the lowest bits of every block. So after
`MUTED_AFTER_S` of nothing but zeros the microphone is *muted*: said once
(the device tells `MicMuted`), and the stream is left as it is (it is not
lost: reopening it would change nothing). The first sample that is not
zero ends it (`MicUnmuted`).

Counted in samples, not on a clock: the verdict depends on what the
microphone delivered, never on how fast the machine handed it on. The
blocks are fed as captured; the silence hold (voice.audio.silence_hold)
only delays quiet blocks and joins them, never changes a sample, so exact
zeros arrive as zeros and a quiet room (not zeros) is never muted. A pure
state machine: no clock, no event loop.
"""

from __future__ import annotations

import numpy as np

from voice.audio.device import MicMuted, MicUnmuted

MUTED_AFTER_S = 10.0  # exact zeros for longer than this: muted (a mute key, not a quiet room)


class MuteWatch:
    """Kept for the device's life, across reopenings of its streams: a mic
    muted before the audio server restarted is still the same muted mic
    after it (said once), and a new device's rate is given with each block."""

    def __init__(self, after_s: float = MUTED_AFTER_S):
        self._after_s = after_s
        self.zeros_s = 0.0  # seconds of exact zeros since the last sample that was not zero
        self.muted = False

    def feed(self, block: np.ndarray, rate: int) -> MicMuted | MicUnmuted | None:
        """One block as captured, at `rate`; returns the change it makes, if any."""
        nonzero = np.flatnonzero(block)
        if not len(nonzero):
            self.zeros_s += len(block) / rate
            if not self.muted and self.zeros_s > self._after_s:
                self.muted = True
                return MicMuted(self.zeros_s)
            return None
        muted_s = self.zeros_s + int(nonzero[0]) / rate
        self.zeros_s = (len(block) - 1 - int(nonzero[-1])) / rate  # the zeros after its last sound start a new run
        if self.muted:
            self.muted = False
            return MicUnmuted(muted_s)
        return None
