"""Keeping the session's sound: the microphone as captured (before echo
cancellation) and what the speaker played, each as 16 kHz mono int16 from
the device's start, so that log positions (mic samples; speaker samples at
the buffer's rate, see `audio/clock`) find their place in them.

Two ways, one tap (`add`, called with every mic block and the speaker
samples handed over with it, the echo reference):

- `Recorder.to_directory(DIR)` (`voice run --record DIR`): everything, written
  as it comes to DIR/mic.wav and DIR/played.wav (the WAV header is patched
  on every write, so a killed process leaves readable files).
- `Recorder.ring(seconds)` (the default): the last `seconds` only, in memory
  (int16 at 16 kHz: 1.9 MB a minute per stream), written out on request
  (`voice ctl save DIR`). Nothing reaches the disk unless asked.

`save(DIR)` writes mic.wav, played.wav, mic_blocks.txt (the size of each mic
block as the device delivered it, one a line: the VAD decides per block, so a
replay cuts the sound the same way) and recording.json (where each track
starts on the device clock, in samples); files 0600 in a 0700 directory.
"""

from __future__ import annotations

import json
import os
import threading
import wave
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from voice.audio.device import MIC_RATE

TRACKS = ("mic", "played")
BLOCKS = "mic_blocks.txt"


def private_directory(path: Path) -> Path:
    """A new or empty directory that only the user can enter; ValueError
    (one line, naming the fix) for one that holds something already."""
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{path} is a file: give a directory to record into")
        if any(path.iterdir()):
            raise ValueError(f"{path} is not empty: give a new directory, so recordings are never mixed")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def private_file(path: Path) -> None:
    os.chmod(path, 0o600)


class Recorder:
    def __init__(self, *, ring_s: float | None = None, directory: Path | None = None, block_sizes: bool = True):
        """`block_sizes`: with `directory`, also write mic_blocks.txt (a
        replay's output does not: its blocks are its scenario's)."""
        self.ring_samples = int(ring_s * MIC_RATE) if ring_s is not None else None
        self.directory = directory
        self._blocks: dict[str, deque[np.ndarray]] = {t: deque() for t in TRACKS}
        self._kept = dict.fromkeys(TRACKS, 0)  # samples held in memory per track
        self._dropped = dict.fromkeys(TRACKS, 0)  # samples let go from the front (the ring)
        self._files: dict[str, wave.Wave_write] = {}
        self._blocks_file = None
        self._lock = threading.Lock()  # `add` on the loop, `save` from a worker thread
        if directory is not None:
            for track in TRACKS:
                w = wave.open(str(directory / f"{track}.wav"), "wb")
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(MIC_RATE)
                self._files[track] = w
                private_file(directory / f"{track}.wav")
            if block_sizes:
                self._blocks_file = open(directory / BLOCKS, "w", buffering=1)  # line-buffered: a killed run keeps it
                private_file(directory / BLOCKS)

    @classmethod
    def ring(cls, seconds: float) -> Recorder | None:
        """The last `seconds` in memory; None when 0 (off)."""
        return cls(ring_s=seconds) if seconds > 0 else None

    @classmethod
    def to_directory(cls, directory: Path) -> Recorder:
        return cls(directory=private_directory(directory))

    def add(self, mic: bytes, played: bytes) -> None:
        """One device block: the mic as captured and what the speaker was handed."""
        with self._lock:
            for track, data in zip(TRACKS, (mic, played), strict=True):
                if not data:
                    continue
                if track in self._files:
                    self._files[track].writeframes(data)
                    if track == "mic" and self._blocks_file is not None:
                        self._blocks_file.write(f"{len(data) // 2}\n")
                    continue
                block = np.frombuffer(data, np.int16).copy()
                self._blocks[track].append(block)
                self._kept[track] += len(block)
                ring = self._blocks[track]
                while self.ring_samples is not None and len(ring) > 1 and self._kept[track] - len(ring[0]) >= self.ring_samples:
                    gone = ring.popleft()
                    self._kept[track] -= len(gone)
                    self._dropped[track] += len(gone)

    def starts(self) -> dict[str, int]:
        """Where each kept track begins on the device clock (samples at 16 kHz)."""
        with self._lock:
            return dict(self._dropped)

    def save(self, directory: Path) -> dict[str, Any]:
        """Write what is kept to `directory` (new or empty): mic.wav, played.wav
        and recording.json. For a recorder that writes to its own directory,
        this closes the files there (and `directory` must be that one)."""
        with self._lock:
            if self.directory is not None:
                self._close()
            else:
                private_directory(directory)
                for track in TRACKS:
                    samples = np.concatenate(self._blocks[track]) if self._blocks[track] else np.zeros(0, np.int16)
                    path = directory / f"{track}.wav"
                    with wave.open(str(path), "wb") as w:
                        w.setnchannels(1)
                        w.setsampwidth(2)
                        w.setframerate(MIC_RATE)
                        w.writeframes(samples.tobytes())
                    private_file(path)
                (directory / BLOCKS).write_text("".join(f"{len(b)}\n" for b in self._blocks["mic"]))
                private_file(directory / BLOCKS)
            info = {"rate": MIC_RATE, "mic_start": self._dropped["mic"], "played_start": self._dropped["played"]}
        path = directory / "recording.json"
        path.write_text(json.dumps(info, indent=2) + "\n")
        private_file(path)
        return info

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        for w in self._files.values():
            w.close()
        self._files.clear()
        if self._blocks_file is not None:
            self._blocks_file.close()
            self._blocks_file = None


def read_recording_info(directory: Path) -> dict[str, Any]:
    """recording.json of a saved recording ({} when there is none: a replay's
    output starts at the device's start)."""
    path = directory / "recording.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not readable JSON ({exc}): save the recording again") from None
