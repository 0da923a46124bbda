"""Reading and writing the WAV files of scenarios and replay outputs."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import soxr


class BadAudio(ValueError):
    pass


# A writer that streams puts a placeholder this large (or larger) in the header
# instead of the length it does not know yet: such a file is not truncated.
_STREAMED_FRAMES = 0x7FFF_0000 // 2


def read_mono16k(path: str | Path, rate: int = 16000) -> np.ndarray:
    """A WAV as int16 mono at `rate`. Other rates are resampled (soxr);
    stereo is refused with the fix, since mixing could hide a wrong file."""
    path = Path(path)
    if path.is_dir():
        raise BadAudio(f"{path} is a directory, not a WAV file")
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, src_rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            declared = w.getnframes()
            frames = w.readframes(declared)
    except FileNotFoundError:
        raise BadAudio(f"audio file not found: {path}") from None
    except OSError as exc:
        raise BadAudio(f"cannot read the audio file {path}: {exc.strerror or exc}") from None
    except EOFError:  # the wave module says nothing more
        size = path.stat().st_size
        why = "it is empty (0 bytes)" if size == 0 else f"it ends ({size} bytes) before its WAV header does"
        raise BadAudio(f"{path} is not a readable WAV file: {why}") from None
    except wave.Error as exc:
        raise BadAudio(f"{path} is not a readable WAV file: {exc}") from None
    if width != 2:
        raise BadAudio(f"{path}: {8 * width}-bit samples; convert to 16-bit: sox {path.name} -b 16 out.wav")
    if channels != 1:
        raise BadAudio(f"{path}: {channels} channels; convert to mono: sox {path.name} -c 1 out.wav")
    if len(frames) % 2:
        raise BadAudio(f"{path} is not a readable WAV file: it ends in the middle of a sample")
    if len(frames) // 2 < declared and declared < _STREAMED_FRAMES:  # cut short: a replay of it would differ
        raise BadAudio(f"{path} ends after {len(frames) / 2 / src_rate:.1f} s but its header says "
                       f"{declared / src_rate:.1f} s: the file is truncated (to use what is there: "
                       f"sox --ignore-length {path.name} fixed.wav)")
    samples = np.frombuffer(frames, dtype="<i2").astype(np.int16)
    if src_rate != rate:
        samples = soxr.resample(samples, src_rate, rate).astype(np.int16)
    return samples


def write_wav(path: str | Path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.asarray(samples, dtype="<i2").tobytes())
