"""Speech onset from the first frames: when to pause the reply.

pipecat's Silero analyzer says SPEAKING only after `start_secs` of frames
that pass both its confidence and its volume gate, and its volume gate is a
0.4 s loudness window smoothed per frame: after an onset it takes 100-170 ms
to open (benchmarks/RESULTS.md, the VAD grid). The pause is reversible (the
barge-in controller confirms or resumes it), so it need not wait for that:
`OnsetDetector` takes it on the first 32 ms Silero frame that the model
scores as speech and that is itself loud enough on the echo-cancelled
signal (`ONSET_CONFIDENCE`, `LEVEL_FLOOR_DBFS`). The frame's probability
is the same model call the analyzer makes
(`FrameScoringSilero` keeps it), so this costs no inference of its own.

Echo safety: the echo canceller's residual of the assistant's own voice sits
at the noise floor (measured -65 dBFS on the laptop-speaker scenarios, Silero
below 0.05), well under the level floor; a pause that no SPEAKING follows is
withdrawn by the controller (voice.speech.barge_in) within `TENTATIVE_S`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.audio.vad.vad_analyzer import VADState

FRAME = 512  # samples: one Silero window at 16 kHz (32 ms)
LEVEL_FLOOR_DBFS = -50.0  # a frame quieter than this is not an onset, whatever Silero says
# Silero's probability for one frame to pause on. 0.7 (the VAD's own threshold) paused on a -26 dBFS
# harmonic hum that SPEAKING never reached; at 0.85 the non-speech set pauses exactly as often as
# with SPEAKING alone (benchmarks/ack.py --frames), and speech frames score 0.9-1.0.
ONSET_CONFIDENCE = 0.85
MAX_LEAD_S = 0.5  # SPEAKING this long after an onset frame is other speech, not its confirmation


@dataclass(frozen=True)
class ScoredFrame:
    end: int  # samples between the frame's end and the end of the audio fed so far (>= 0)
    confidence: float  # Silero's speech probability
    level_dbfs: float  # the frame's RMS level


def level_dbfs(pcm: bytes) -> float:
    samples = np.frombuffer(pcm, np.int16).astype(np.float64)
    if not len(samples):
        return -np.inf
    rms = float(np.sqrt(np.mean(samples * samples)))
    return 20 * np.log10(rms / 32768) if rms > 0 else -np.inf


class FrameScoringSilero(SileroVADAnalyzer):
    """pipecat's Silero analyzer that also keeps each frame's probability and
    level, so the onset can be judged from the model call the analyzer makes."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._scored: list[tuple[float, float]] = []  # (confidence, level) of the frames of the current call
        self._frames: list[ScoredFrame] = []

    def voice_confidence(self, buffer) -> float:
        confidence = super().voice_confidence(buffer)
        self._scored.append((float(np.ravel(confidence)[0]), level_dbfs(bytes(buffer))))
        return confidence

    def _run_analyzer(self, buffer: bytes):
        """On the analyzer's thread, one call per mic block."""
        self._scored = []
        state = super()._run_analyzer(buffer)
        left = len(self._vad_buffer) // 2  # samples after the last whole frame, kept for the next call
        n = len(self._scored)
        self._frames = [ScoredFrame(left + (n - 1 - i) * FRAME, c, lv) for i, (c, lv) in enumerate(self._scored)]
        return state

    def take_frames(self) -> list[ScoredFrame]:
        """The frames the last `analyze_audio` call scored, oldest first (once)."""
        frames, self._frames = self._frames, []
        return frames

    def restart(self, skipped: int) -> None:
        """The VAD was off for `skipped` samples of quiet and starts again on
        a frame boundary: as if it had scored them as quiet. Its state was
        QUIET when it stopped; the partial frame is dropped, the loudness
        window emptied (the caller feeds its pre-roll first), the model keeps
        its state and its periodic reset comes when it would have.
        Call between `analyze_audio` calls."""
        self._vad_buffer = b""
        self._volume_tracker.reset()
        self._prev_volume = 0.0
        self._windows_since_reset += skipped // FRAME
        self._low_confidence_windows += skipped // FRAME

    def forget_speech(self) -> None:
        """The audio broke off (a lost sound card): speech it was in the
        middle of is over, so the next run starts QUIET, as `restart` needs.
        (pipecat's analyzer keeps these three; nothing else of its state
        says what it was deciding.)"""
        self._vad_state = VADState.QUIET
        self._vad_starting_count = self._vad_stopping_count = 0


class OnsetDetector:
    """Speech began where `frames` consecutive frames were scored at least
    `confidence` and were at least `level_floor_dbfs` loud."""

    def __init__(self, confidence: float = ONSET_CONFIDENCE, *, frames: int = 1,
                 level_floor_dbfs: float = LEVEL_FLOOR_DBFS):
        self.confidence = confidence
        self.frames_needed = frames
        self.level_floor_dbfs = level_floor_dbfs
        self._run = 0  # consecutive speech frames so far

    def feed(self, frames: list[ScoredFrame], end: int) -> int | None:
        """The frames scored on a block that ends at stream position `end`.
        Returns the stream position where the speech began on the frame that
        completes the run (None otherwise)."""
        onset = None
        for frame in frames:
            if frame.confidence >= self.confidence and frame.level_dbfs >= self.level_floor_dbfs:
                self._run += 1
                if self._run == self.frames_needed:
                    onset = max(0, end - frame.end - self.frames_needed * FRAME)
            else:
                self._run = 0
        return onset

    def reset(self) -> None:
        self._run = 0
