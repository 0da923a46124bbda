"""Echo cancellation before VAD: WebRTC AEC3 through livekit's
AudioProcessingModule, on 10 ms int16 frames at 16 kHz.

The reference is exactly what the output callback handed to the device
since the previous mic block (tapped at write time, resampled to 16 kHz
once), handed on with the mic block that follows it: sound is written to
the speaker before its echo can be captured, so the reference leads the
echo by the output latency plus at most one block, a delay the canceller
estimates. Measured: fed 40 ms late, every canceller failed, so the
reference never takes a detour through a queue the mic does not share.

AEC3 also holds back near-end speech while the far end plays, even when no
echo reaches the mic (a headset): a short "Stop." was then heard 1.5 s late.
So the canceller always runs (it stays converged), but its output is used
only while the mic measurably carries the speaker: the 20th percentile,
over the last few seconds of loud playback, of mic/reference level, each
the loudest 10 ms in the last half second for the mic and in the quarter
second before that for the reference (so an echo delayed up to 250 ms lines
up; the person's voice only ever raises the estimate, the safe side).

AEC3 through livekit's FFI is the largest single cost while the service
waits (3.2 % of a core), so it runs only while there is echo to cancel:
while the assistant is busy (a turn running or audio queued, so it is
running some time before the first sample plays) and for `TAIL_S` after the
speaker last played something loud (the room's echo). Otherwise the mic
passes through untouched, in the same 10 ms framing, and the reference is
dropped, so the two streams stay aligned when it starts again.

AEC3 leaves a residual of the echo while it converges (the first second of
the first reply) and when the room's tail outlasts its filter: measured on
the laptop-speaker scenarios, up to -30 dBFS, 13.6 dB under the echo itself,
which Silero took for speech (a 1.3 s pause of the reply, in about 1 replay
of 3). So while the speaker is coupled, a cleaned 10 ms frame more than
`RESIDUAL_DB` under the loudest echo the last `ECHO_SPAN` of playback can
have put into the mic (the reference's level plus the measured coupling) is
taken for residual echo and attenuated by 40 dB. A person barging in is at or
above the echo's level (measured: median +0.7 dB); only the quiet first frames
of their onset fall under the line, which delays a pause by a frame or two.
"""

from __future__ import annotations

import numpy as np

FRAME = 160  # 10 ms at 16 kHz
COUPLED_DB = -45.0  # mic/reference energy above this in quiet moments: the speaker reaches the mic
LOUD_REFERENCE = 300.0  # RMS of a reference block that counts as playback
WINDOW = 300  # estimates kept (~3 s of loud playback)
ENVELOPE = 50  # frames (0.5 s) over which mic and reference levels are compared
TAIL_S = 2.0  # AEC3 keeps running this long after the speaker last played something loud
RESIDUAL_DB = 10.0  # a cleaned frame this far under the loudest echo expected is residual echo
ECHO_SPAN = 30  # frames (300 ms) of reference that can still be echoing: delays up to 250 ms, a short tail
UNMEASURED_COUPLING_DB = -6.0  # echo/reference before the coupling is measured: the loudest laptop path
RESIDUAL_GAIN = 0.01  # -40 dB: a residual frame ends under the onset's level floor


class EchoUnavailable(RuntimeError):
    pass


class EchoCanceller:
    def __init__(self) -> None:
        try:
            from livekit import rtc
        except ImportError as exc:  # the wheel is missing or broken on this platform
            raise EchoUnavailable(f"echo cancellation needs the livekit package ({exc}): pip install livekit") from None
        self._rtc = rtc
        self.restart()

    def restart(self) -> None:
        """Start afresh, as on a new echo path (a reopened sound card)."""
        rtc = self._rtc
        # Noise suppression hurt double-talk in the measurements; AGC would fight the VAD's volume gate.
        self._apm = rtc.AudioProcessingModule(echo_cancellation=True, high_pass_filter=True,
                                              noise_suppression=False, auto_gain_control=False)
        self._mic = np.zeros(0, np.int16)
        self._ref = np.zeros(0, np.int16)
        self._ratios: list[float] = []  # mic/reference level (dB) during recent loud playback
        self._ref_levels: list[float] = []
        self._mic_levels: list[float] = []
        self.coupled = True  # until measured, assume laptop speakers
        self._coupling_db = UNMEASURED_COUPLING_DB  # echo level over reference level, once measured
        self.running = True  # AEC3 is processing (False: idle, the mic passes through)
        self._quiet_samples = 0  # mic samples since the reference was last loud

    def process(self, mic: bytes, reference: bytes, *, busy: bool = True) -> bytes:
        """One mic block: `reference` (what was handed to the speaker since
        the block before, 16 kHz) and `mic` (captured with it); `busy`: the assistant is busy (it may play
        soon). Returns as many cleaned mic samples as whole 10 ms frames
        allow; the rest waits for the next block."""
        ref = np.frombuffer(reference, np.int16)
        self._mic = np.concatenate([self._mic, np.frombuffer(mic, np.int16)])
        if len(ref) and int(np.max(np.abs(ref.astype(np.int32)))) >= LOUD_REFERENCE:
            self._quiet_samples = 0
        else:
            self._quiet_samples += len(mic) // 2
        if not busy and self._quiet_samples > TAIL_S * 16000:  # nothing to cancel: pass the mic through
            self.running = False
            self._ref = np.zeros(0, np.int16)
            whole = len(self._mic) - len(self._mic) % FRAME
            out, self._mic = self._mic[:whole], self._mic[whole:]
            return out.tobytes()
        self.running = True
        self._ref = np.concatenate([self._ref, ref])
        out = []
        while len(self._mic) >= FRAME:
            raw = self._mic[:FRAME]
            if len(self._ref) >= FRAME:
                ref = self._ref[:FRAME]
                self._apm.process_reverse_stream(self._frame(ref))
                self._ref = self._ref[FRAME:]
                self._measure(raw, ref)
            frame = self._frame(raw)
            self._apm.process_stream(frame)  # in place
            out.append(self._residual_gate(np.frombuffer(bytes(frame.data), np.int16)) if self.coupled else raw)
            self._mic = self._mic[FRAME:]
        if len(self._ref) > 10 * FRAME:  # the mic stalled: never let the reference run ahead by more than 100 ms
            self._ref = self._ref[-FRAME:]
        return np.concatenate(out).tobytes() if out else b""

    def _residual_gate(self, cleaned: np.ndarray) -> np.ndarray:
        """The canceller's frame, or it 40 dB down when it is too quiet to be
        anything but what is left of the echo."""
        loudest = max(self._ref_levels[-ECHO_SPAN:], default=0.0)
        if loudest < LOUD_REFERENCE:
            return cleaned
        echo_db = 20 * np.log10(loudest) + self._coupling_db
        level = float(np.sqrt(np.mean(cleaned.astype(np.float64) ** 2)))
        if 20 * np.log10(level + 1e-3) >= echo_db - RESIDUAL_DB:
            return cleaned
        return (cleaned * RESIDUAL_GAIN).astype(np.int16)

    def _measure(self, mic: np.ndarray, ref: np.ndarray) -> None:
        self._ref_levels = (self._ref_levels + [float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))])[-ENVELOPE:]
        self._mic_levels = (self._mic_levels + [float(np.sqrt(np.mean(mic.astype(np.float64) ** 2)))])[-ENVELOPE:]
        # The reference's first half of the window: its echo (delays up to
        # 250 ms) has arrived somewhere in the mic's whole window by now.
        ref_level = max(self._ref_levels[: ENVELOPE // 2])
        if ref_level < LOUD_REFERENCE or len(self._ref_levels) < ENVELOPE:
            return
        ratio = 20 * np.log10((max(self._mic_levels) + 1e-3) / ref_level)
        self._ratios = (self._ratios + [ratio])[-WINDOW:]
        if len(self._ratios) >= ENVELOPE:  # half a second of playback measured
            self._coupling_db = float(np.percentile(self._ratios, 20))
            self.coupled = self._coupling_db > COUPLED_DB

    def _frame(self, samples: np.ndarray):
        return self._rtc.AudioFrame(bytearray(samples.astype(np.int16).tobytes()), 16000, 1, FRAME)
