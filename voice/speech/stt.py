"""Speech to text with faster-whisper, on the CPU, from bundled weights.

Whisper encodes a 30 s window whatever the utterance length, so latency is a
fixed cost per utterance: the pipeline hands over whole utterances (and the
utterance so far at a pause: voice.speech.turn_end). `RemoteSttEngine` does
the same over HTTP, on an OpenAI-compatible transcription server.
"""

from __future__ import annotations

import io
import os
import time
import wave
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from voice.speech import models

os.environ.setdefault("HF_HUB_OFFLINE", "1")

STT_MODELS = ("base", "tiny.en")
# Whisper makes words of a hum, a breath or a cough ("mm hmm" -> "and then",
# a cough -> "but") with low confidence: on the fixtures an average
# log-probability of -0.92 to -1.49, where requests of two words or more scored
# above -0.93 (base and tiny.en, whole and cut as the VAD cuts, on four of MKL's and
# CTranslate2's numeric paths). Below -1.0 words are doubtful; below -0.9 too
# when Whisper also thinks it likely there was no speech (no-speech
# probability over 0.4; real requests: at most 0.38). One word is the
# exception no threshold fixes: a bare "Stop" scored -0.5 to -1.9 by numeric
# path, tiny.en's "What?" -1.15. So the barge-in rule never judges a stop
# phrase by its confidence (voice.speech.barge_in).
DOUBTFUL_LOGPROB, UNSURE_LOGPROB, DOUBTFUL_NO_SPEECH = -1.0, -0.9, 0.4


@dataclass(frozen=True)
class Transcript:
    text: str
    seconds: float  # compute time
    doubtful: bool = False  # every segment looks like Whisper guessing at a sound


class SttUnavailable(Exception):
    """The recogniser could not be asked (a transcription server down or
    failing): the words of that utterance are lost, and the person is told."""


class SttEngine(Protocol):
    name: str

    def transcribe(self, audio: np.ndarray) -> Transcript:
        """Blocking: float32 mono 16 kHz in, text out. Run it in an executor."""
        ...


class WhisperEngine:
    def __init__(self, model: str = "base", threads: int = 2):
        from faster_whisper import WhisperModel

        if model not in STT_MODELS:
            raise ValueError(f"stt.model = {model!r}: allowed {', '.join(STT_MODELS)}")
        self.name = model
        if model == "tiny.en":
            self._model = WhisperModel(str(models.whisper_tiny_en()), device="cpu", compute_type="int8", cpu_threads=threads)
        else:
            self._model = WhisperModel(
                "whisper-base", device="cpu", compute_type="int8", cpu_threads=threads, files=models.whisper_base_files()
            )

    def transcribe(self, audio: np.ndarray) -> Transcript:
        started = time.perf_counter()
        segments, _ = self._model.transcribe(
            audio, language="en", beam_size=1, vad_filter=False, temperature=0.0,
            condition_on_previous_text=False, without_timestamps=True,
        )
        segments = list(segments)  # decoding happens while iterating
        text = " ".join(s.text.strip() for s in segments).strip()
        doubtful = bool(segments) and all(
            s.avg_logprob < DOUBTFUL_LOGPROB or (s.avg_logprob < UNSURE_LOGPROB and s.no_speech_prob > DOUBTFUL_NO_SPEECH)
            for s in segments)
        return Transcript(text, time.perf_counter() - started, doubtful)

    def words(self, audio: np.ndarray) -> list[tuple[str, float, float]]:
        """Each recognised word with its start and end in seconds."""
        segments, _ = self._model.transcribe(
            audio, language="en", beam_size=1, vad_filter=False, temperature=0.0,
            condition_on_previous_text=False, word_timestamps=True,
        )
        return [(w.word.strip(), w.start, w.end) for s in segments for w in (s.words or [])]


class RemoteSttEngine:
    """An OpenAI-compatible transcription server (`POST {base_url}/audio/
    transcriptions`, as faster-whisper servers and vLLM offer): the same
    interface as `WhisperEngine`, for a bigger machine. `verbose_json`
    brings the segments' log-probabilities, so doubtful words are judged as
    locally; a server that sends only text never marks words doubtful."""

    def __init__(self, base_url: str, model: str = "whisper-1", timeout_s: float = 10.0, api_key: str = "none"):
        from openai import OpenAI

        self.name = f"remote:{model}"
        self._model = model
        self._client = OpenAI(base_url=base_url.rstrip("/"), api_key=api_key, timeout=timeout_s, max_retries=0)

    def transcribe(self, audio: np.ndarray) -> Transcript:
        import openai

        started = time.perf_counter()
        try:
            reply = self._client.audio.transcriptions.create(
                model=self._model, file=("utterance.wav", _wav(audio)), language="en", temperature=0.0,
                response_format="verbose_json")
        except openai.APIError as exc:
            raise SttUnavailable(f"the transcription server {self._client.base_url} failed: {exc}") from None
        segments = getattr(reply, "segments", None) or []
        doubtful = bool(segments) and all(
            s.avg_logprob < DOUBTFUL_LOGPROB or (s.avg_logprob < UNSURE_LOGPROB and s.no_speech_prob > DOUBTFUL_NO_SPEECH)
            for s in segments)
        return Transcript(reply.text.strip(), time.perf_counter() - started, doubtful)


def _wav(audio: np.ndarray) -> bytes:
    """float32 mono 16 kHz -> a 16-bit WAV file's bytes."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype(np.int16).tobytes())
    return out.getvalue()
