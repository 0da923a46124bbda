"""Fakes at the speech Protocols (voice.speech.stt.SttEngine,
voice.speech.tts.TtsEngine), for the in-process timeline tests
(tests/timeline.py). Everything else in those tests is real: the Silero VAD,
the pipeline, the surface, barge-in control, the turn runner, the agent loop
and its SQLite log, the scripted provider and the replay device.

- `ScriptedStt` hears what each fixture clip says: it recognises which clip
  an utterance's audio came from (the replay device mixes clips into the mic
  sample for sample, so a stretch of the clip appears in it exactly) and
  returns that clip's scripted transcript. Audio it cannot place is an error,
  never a guess. Audio that holds only the start of a clip (a speculative
  recognition at a pause, voice.speech.turn_end) gets the same share of the
  clip's words, with no final punctuation: what is unfinished reads so.
- `WordTts` speaks every word for exactly `word_ms`, each word's samples all
  one nonzero value that names the word (`SpokenWord.code`), so what the
  speaker played says by itself which words were heard, and how much of
  each: `WordTts.heard(played)`.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from voice.speech.stt import Transcript
from voice.speech.tts import SpeechAudio, WordTiming

# A stretch this long of a clip's loud part identifies the clip in an utterance.
_PROBE = 320  # samples (20 ms at 16 kHz)


@dataclass(frozen=True)
class Said:
    """What the fake recogniser hears in one clip."""

    text: str
    doubtful: bool = False  # Whisper's "too unsure to be words" (a hum, a cough)
    compute_s: float = 0.0  # how long recognising it takes (in the executor, as Whisper does)


@dataclass
class ScriptedStt:
    """`clips`: name -> int16 samples (as the replay device mixes them);
    `said`: name -> what is heard in it."""

    clips: dict[str, np.ndarray]
    said: dict[str, Said]
    name: str = "scripted-stt"
    transcribed: list[str] = field(default_factory=list)  # clip names, in the order they were heard
    spend: Callable[[float], None] = time.sleep  # how an executor job takes its compute time

    def transcribe(self, audio: np.ndarray) -> Transcript:
        # The pipeline hands float32 = int16 / 32768: exact, so back to int16 exactly.
        samples = np.round(audio * 32768).astype(np.int16)
        found = self._clips_in(samples)
        texts = []
        for name, share in found:
            said = self.said[name]
            self.transcribed.append(name if share == 1 else f"{name}:start")
            if said.compute_s:
                self.spend(said.compute_s)
            text = said.text
            if share < 1:
                heard = text.split()[: int(len(text.split()) * share)]
                text = " ".join(heard).rstrip(".?!,;:")
            texts.append(text)
        said = self.said[found[0][0]]
        return Transcript(" ".join(t for t in texts if t), said.compute_s, said.doubtful)

    def _clips_in(self, samples: np.ndarray) -> list[tuple[str, float]]:
        """The clips this audio holds, in order (one person may say two in one
        breath), each with the share of its loud span it holds."""
        haystack = samples.tobytes()
        found = []
        for name, clip in self.clips.items():
            loud = np.flatnonzero(np.abs(clip.astype(np.int32)) > 500)
            if not len(loud):
                continue
            probe = clip[loud[0] : loud[0] + _PROBE].tobytes()
            at = haystack.find(probe)
            while at >= 0 and at % 2:  # only whole samples count
                at = haystack.find(probe, at + 1)
            if at >= 0:
                span = int(loud[-1] - loud[0]) + 1
                found.append((at, name, min(1.0, (len(samples) - at // 2) / span)))
        if not found:
            raise AssertionError(f"the fake recogniser cannot tell which clip this utterance is "
                                 f"({len(samples) / 16000:.2f} s)")
        return [(name, share) for _, name, share in sorted(found)]


@dataclass(frozen=True)
class SpokenWord:
    code: int  # the value of every one of its samples
    text: str  # the synthesized sentence it belongs to
    word: WordTiming


@dataclass
class WordTts:
    """Each whitespace token of the text is `word_ms` of sound, back to back."""

    rate: int = 16000
    word_ms: int = 200
    compute_s: float = 0.0  # how long synthesizing a sentence takes (in the executor, as Piper does)
    spend: Callable[[float], None] = time.sleep  # how an executor job takes its compute time
    words: dict[int, SpokenWord] = field(default_factory=dict)  # code -> word, every word ever synthesized
    _lock: threading.Lock = field(default_factory=threading.Lock)  # synthesis runs in the executor

    @property
    def word_samples(self) -> int:
        return self.rate * self.word_ms // 1000

    def synthesize(self, text: str) -> SpeechAudio:
        if self.compute_s:
            self.spend(self.compute_s)
        n = self.word_samples
        tokens = list(re.finditer(r"\S+", text))
        samples = np.zeros(n * len(tokens), np.int16)
        timings = []
        with self._lock:
            for i, m in enumerate(tokens):
                timing = WordTiming(m.group(), m.start(), m.end(), i * n, (i + 1) * n)
                code = len(self.words) + 1
                if code > 32767:
                    raise AssertionError("too many words for one WordTts")
                self.words[code] = SpokenWord(code, text, timing)
                samples[i * n : (i + 1) * n] = code
                timings.append(timing)
        return SpeechAudio(samples, self.rate, tuple(timings), "alignment", 0.0)

    def heard(self, played: np.ndarray) -> list[tuple[SpokenWord, int]]:
        """(word, samples of it played), in the order they first played."""
        counts = Counter(played[played != 0].tolist())
        order = dict.fromkeys(played[played != 0].tolist())
        unknown = [c for c in order if c not in self.words]
        if unknown:
            raise AssertionError(f"played samples no word of this TTS has: {unknown[:5]}")
        return [(self.words[c], counts[c]) for c in order]
