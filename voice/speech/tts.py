"""Text to speech with piper, and which sample range each word occupies.

Word timings come from piper's phoneme alignments (the voice's ONNX graph
patched to output durations; `include_alignments=True`), which sum exactly to
the audio. Where a voice lacks them, a sentence's samples are shared out over
its phonemes equally (the phoneme-count rule). Either way each word is a
whitespace token of the text with its character span, so a played-sample
count maps straight to a delivered character prefix.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import soxr

from voice.speech import models, piper_graph

# Phonemes that are not part of a word: sentence start/end, space, punctuation.
_NOT_WORD = set("^$ ,.;:!?¡¿—…\"'()")


@dataclass(frozen=True)
class WordTiming:
    word: str
    char_start: int  # in the synthesized text
    char_end: int
    start: int  # sample range at the output rate
    end: int


@dataclass(frozen=True)
class SpeechAudio:
    samples: np.ndarray  # int16 mono at `rate`
    rate: int
    words: tuple[WordTiming, ...]
    method: str  # "alignment" | "phoneme-count" | "characters"
    seconds: float  # compute time


class TtsEngine(Protocol):
    rate: int

    def synthesize(self, text: str) -> SpeechAudio:
        """Blocking; run it in an executor."""
        ...


@dataclass(eq=False)
class Synthesis:
    """One sentence synthesized in the executor, and when (`time.monotonic`,
    read at call time: the log's `at_mono` clock, a replay's virtual one) it
    was asked for and its audio was ready: `speech/sentence` logs them."""

    job: asyncio.Future  # of SpeechAudio
    asked: float
    early: bool  # the early start's, speculative (voice.speech.early_speech)
    ready: float | None = None

    @classmethod
    def start(cls, tts: TtsEngine, text: str, *, early: bool = False) -> Synthesis:
        """`text` synthesized in the default executor, from now."""
        synthesis = cls(asyncio.get_running_loop().run_in_executor(None, tts.synthesize, text), time.monotonic(), early)
        synthesis.job.add_done_callback(synthesis._done)
        return synthesis

    def _done(self, job: asyncio.Future) -> None:
        self.ready = time.monotonic()


def _phoneme_word_spans(phonemes: list[str], sample_counts: list[int]) -> list[tuple[int, int]]:
    """Sample spans of the words in one sentence: runs of word phonemes."""
    spans, pos, current = [], 0, None
    for ph, n in zip(phonemes, sample_counts):
        if ph in _NOT_WORD:
            if current:
                spans.append(current)
                current = None
        else:
            current = (pos, pos + n) if current is None else (current[0], pos + n)
        pos += n
    if current:
        spans.append(current)
    return spans


def _count_words(phonemes: list[str]) -> int:
    return len(_phoneme_word_spans(phonemes, [1] * len(phonemes)))


def _set_voice_once() -> None:
    """espeak-ng keeps about 1.3 KB in every `espeak_SetVoiceByName`, and
    piper sets the voice before every phonemization: once per sentence
    spoken and once per word timed (`_map_tokens`), about 12 KB a turn, the
    whole of what the 1,000-turn soak grew by (benchmarks/soak.py). One voice
    speaks in this process, so it is set once per name. Idempotent."""
    from piper import espeakbridge

    if getattr(espeakbridge.set_voice, "voice_set_once", False):
        return
    set_voice, current = espeakbridge.set_voice, [None]

    def set_voice_once(name: str) -> None:
        if name != current[0]:
            set_voice(name)
            current[0] = name

    set_voice_once.voice_set_once = True
    espeakbridge.set_voice = set_voice_once


class PiperEngine:
    def __init__(self, rate: int, alignments: bool = True, threads: int = 0):
        _set_voice_once()
        model, config = models.piper_joe()
        self._voice = piper_graph.load_voice(model, config, alignments, threads)
        self._alignments = alignments
        self.source_rate = self._voice.config.sample_rate
        self.rate = rate

    def synthesize(self, text: str) -> SpeechAudio:
        started = time.perf_counter()
        chunks = list(self._voice.synthesize(text, include_alignments=self._alignments))
        spans: list[tuple[int, int]] = []
        offset, method = 0, "alignment"
        for ch in chunks:
            seq = ["^", *ch.phonemes, "$"]
            if ch.phoneme_alignments:
                counts = [int(a.num_samples) for a in ch.phoneme_alignments]
                seq = [a.phoneme for a in ch.phoneme_alignments]
            else:
                method = "phoneme-count"
                n = len(ch.audio_int16_array)
                counts = list(np.diff(np.linspace(0, n, len(seq) + 1).round().astype(int)))
            spans += [(a + offset, b + offset) for a, b in _phoneme_word_spans(seq, counts)]
            offset += len(ch.audio_int16_array)
        source = np.concatenate([c.audio_int16_array for c in chunks]) if chunks else np.zeros(0, np.int16)
        tokens = [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", text)]
        words = self._map_tokens(tokens, spans)
        if words is None:  # espeak read the text differently: share out by characters
            method = "characters"
            words = _by_characters(tokens, len(source))
        samples, words = self._to_output_rate(source, words)
        return SpeechAudio(samples, self.rate, tuple(words), method, time.perf_counter() - started)

    def _map_tokens(self, tokens, spans) -> list[WordTiming] | None:
        """Each token covers as many phoneme words as espeak makes of it alone
        ("10:30" is two). None when the counts do not add up."""
        words, i = [], 0
        for tok, cs, ce in tokens:
            n = sum(_count_words(s) for s in self._voice.phonemize(tok))
            if n == 0:
                continue  # a token with no sound ("-") is never "heard" on its own
            group = spans[i : i + n]
            if len(group) < n:
                return None
            words.append(WordTiming(tok, cs, ce, group[0][0], group[-1][1]))
            i += n
        return words if i == len(spans) else None

    def _to_output_rate(self, source: np.ndarray, words: list[WordTiming]) -> tuple[np.ndarray, list[WordTiming]]:
        if self.rate == self.source_rate:
            return source, words
        out = soxr.resample(source, self.source_rate, self.rate, quality="HQ").astype(np.int16)
        k = len(out) / max(1, len(source))
        return out, [WordTiming(w.word, w.char_start, w.char_end, round(w.start * k), min(len(out), round(w.end * k)))
                     for w in words]


def _by_characters(tokens, total: int) -> list[WordTiming]:
    chars = sum(len(t) for t, _, _ in tokens) or 1
    out, pos = [], 0.0
    for tok, cs, ce in tokens:
        end = pos + total * len(tok) / chars
        out.append(WordTiming(tok, cs, ce, round(pos), round(end)))
        pos = end
    return out
