"""What an independent transcription hears in played audio: the check
behind I1 (replay and live). faster-whisper (base) transcribes the audio,
padded 0.3 s each side; only words it places wholly inside the audio count
(it completes a sentence cut mid-word: "water on" -> "water on Earth")."""

from __future__ import annotations

import re
from functools import cache

import numpy as np

RATE = 16000


def words(text: str) -> list[str]:
    text = text.lower().replace("sea", "c")  # whisper hears "sea" as "C" on this voice
    return re.findall(r"[a-z0-9']+", text)


def common_in_order(a: list[str], b: list[str]) -> int:
    """Length of the longest common subsequence of two word lists."""
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], prev + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def word_errors(reference: list[str], heard: list[str]) -> int:
    """Substitutions, insertions and deletions that turn one into the other."""
    row = list(range(len(heard) + 1))
    for i, ref in enumerate(reference, 1):
        diagonal, row[0] = row[0], i
        for j, word in enumerate(heard, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (ref != word))
    return row[-1]


def cut_error(heard: list[str], delivered: list[str]) -> int | None:
    """Words heard after the delivered prefix's end (negative: fewer): the
    error at the cut, found by anchoring on the last delivered word (or the
    one before it, if the transcriber misheard the last)."""
    for k in (1, 2):
        if len(delivered) >= k:
            found = [i for i, h in enumerate(heard) if h == delivered[-k]]
            if found:
                return (len(heard) - 1 - found[-1]) - (k - 1)
    return None


@cache
def whisper():
    from voice.speech.builder import loaded_once
    from voice.speech.stt import WhisperEngine

    return loaded_once(WhisperEngine, "base", 2)  # the one in-process replays load (voice.toml's [stt] threads)


def heard_words(audio: np.ndarray) -> list[str]:
    """Whisper's words wholly inside `audio` (int16, 16 kHz)."""
    pad = np.zeros(RATE * 3 // 10, np.int16)
    x = np.concatenate([pad, audio, pad]).astype(np.float32) / 32768
    cut = (len(pad) + len(audio)) / RATE
    return words(" ".join(w for w, _, end in whisper().words(x) if end <= cut + 0.02))
