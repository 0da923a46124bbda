"""Wake-word detection on the mic stream (microWakeWord via pymicro-wakeword).

`WakeWordDetector.process(block)` takes 16 kHz mono int16 PCM in blocks of
any size and returns True on the block in which the wake word is detected.
Internally: pymicro-features turns each 10 ms (160 samples) into one
feature window (30 ms window, 10 ms step); the TFLite model runs once per
`stride` windows (3 for the bundled models: every 30 ms) and the package
averages its last `sliding_window_size` (5) probabilities; a detection is
that mean above the model's `probability_cutoff` (0.85 for okay_nabu).
The mean stays above the cutoff for ~0.5 s after one utterance of the wake
word (and the package reports it on every inference), so a detection needs
the mean to have dropped below the cutoff since the last one, and a
refractory period: one utterance gives one detection.

Everything is synchronous and CPU-only (no threads, no asyncio): the cost is
about 0.1 ms per 20 ms block, cheap enough to call inline from the listen
loop next to the VAD.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
_FEATURE_SAMPLES = 160  # one feature window per 10 ms


def _models_dir() -> Path:
    import pymicro_wakeword

    return Path(pymicro_wakeword.__file__).parent / "models"


def available_models() -> list[str]:
    """Names of the wake-word models bundled with pymicro-wakeword (those
    whose .json and .tflite are both installed), sorted."""
    d = _models_dir()
    return sorted(p.stem for p in d.glob("*.json") if (d / f"{p.stem}.tflite").is_file())


class WakeWordDetector:
    """A streaming wake-word detector with a refractory period.

    model: one of available_models() ("okay_nabu", "hey_jarvis",
        "hey_mycroft", "alexa").
    refractory_s: after a detection no new one is reported for this long
        (stream time) *and* until the model's averaged probability has
        fallen back below its cutoff, so one utterance gives one detection.
    threshold: overrides the model's probability_cutoff (None: the model's).
    """

    def __init__(self, model: str = "okay_nabu", *, refractory_s: float = 1.0, threshold: float | None = None):
        names = available_models()
        if model not in names:
            raise ValueError(f"unknown wake word model {model!r}: allowed {', '.join(names) or '(none installed)'}")
        from pymicro_wakeword import MicroWakeWord, MicroWakeWordFeatures

        self.model = model
        self._mww = MicroWakeWord.from_config(_models_dir() / f"{model}.json")
        self._features = MicroWakeWordFeatures()
        self.wake_word: str = self._mww.wake_word  # e.g. "Okay Nabu"
        self.threshold = float(self._mww.probability_cutoff if threshold is None else threshold)
        self.refractory_samples = int(refractory_s * SAMPLE_RATE)
        self._init_state()

    def _init_state(self) -> None:
        self.position = 0  # samples fed since construction / reset()
        # End (in samples) of the latest feature window: the frontend's first
        # 30 ms window ends at sample 480, each later one 160 samples on.
        self._fed = 2 * _FEATURE_SAMPLES
        self._windows = 0  # feature windows since reset; the model runs on every stride-th
        self._pending = b""  # an odd trailing byte is kept until the next block
        self.probability = 0.0  # the latest averaged probability
        self.last_detection: int | None = None  # sample position of the last detection
        self.detections = 0
        self._armed = True  # False from a detection until the probability falls below threshold

    def process(self, block: bytes) -> bool:
        """Feed 16 kHz mono int16 PCM; True when the wake word is detected in it.

        `last_detection` then holds the stream position (samples since
        construction or reset()) of the feature window that crossed the
        cutoff; it falls 0.1-0.3 s after the end of the spoken wake word."""
        data = self._pending + bytes(block)
        if len(data) % 2:
            data, self._pending = data[:-1], data[-1:]
        else:
            self._pending = b""
        start = self.position
        self.position += len(data) // 2
        detected = False
        for features in self._features.process_streaming(data):
            self._fed += _FEATURE_SAMPLES
            self._windows += 1
            prob = self._mww.process_streaming_prob(features)
            if prob is None:  # the interpreter was closed
                continue
            if self._windows % self._mww.stride:
                continue  # windows between inferences report 0.0, which is no measurement
            self.probability = prob
            at = min(self._fed, self.position)
            if prob <= self.threshold:
                self._armed = True
                continue
            in_refractory = self.last_detection is not None and at - self.last_detection < self.refractory_samples
            if self._armed and not in_refractory:
                self.last_detection = max(at, start)
                self.detections += 1
                detected = True
            self._armed = False  # a stretch above the cutoff that outlasts the refractory is still one
        return detected

    def reset(self) -> None:
        """Forget all audio: the feature frontend, the model's streaming
        state (the package reloads the interpreter, ~1 ms), the probability
        window, the refractory period and the stream position."""
        self._features.reset()
        self._mww.reset()
        self._init_state()

    def close(self) -> None:
        self._mww.close()

    @property
    def grid(self) -> int:
        """Samples between two runs of the model (stride feature windows): a
        stream fed again after a rest keeps its places only if what it skips
        is a whole number of these."""
        return self._mww.stride * _FEATURE_SAMPLES

    @property
    def behind(self) -> int:
        """Samples from the last detection to the end of what was fed (0: none yet)."""
        return 0 if self.last_detection is None else self.position - self.last_detection

    @property
    def seconds(self) -> float:
        """Stream time (s) of the audio fed so far."""
        return self.position / SAMPLE_RATE


def detections_in(samples: np.ndarray, detector: WakeWordDetector, block: int = 320) -> list[int]:
    """Feed int16 `samples` in `block`-sample blocks; the stream positions
    (samples) of the detections. For tests and offline checks."""
    pcm = np.asarray(samples, dtype="<i2").tobytes()
    found = []
    for i in range(0, len(pcm), block * 2):
        if detector.process(pcm[i:i + block * 2]):
            found.append(detector.last_detection)
    return found
