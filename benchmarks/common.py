"""Shared helpers for the benchmark suite: paths, stats, word scoring,
subprocess replays and the independent (faster-whisper base) transcriber."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

os.environ["HF_HUB_OFFLINE"] = "1"

ROOT = Path(__file__).resolve().parents[1]
AUDIO = ROOT / "tests" / "fixtures" / "audio"
RATE = 16000
LOUD = 500  # the scenario loader's onset threshold (voice/audio/scenario.py)


# -- statistics ----------------------------------------------------------------


def pct(values: list[float], q: float) -> float | None:
    """Percentile with linear interpolation (numpy's default)."""
    vals = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return None
    return float(np.percentile(vals, q))


def stats(values: list[float]) -> dict[str, Any]:
    vals = [float(v) for v in values if v is not None]
    return {
        "p50": pct(vals, 50),
        "p95": pct(vals, 95),
        "mean": float(np.mean(vals)) if vals else None,
        "min": min(vals) if vals else None,
        "max": max(vals) if vals else None,
        "n": len(vals),
    }


# -- words ---------------------------------------------------------------------


def words(text: str) -> list[str]:
    text = text.lower().replace("’", "'")
    return re.findall(r"[a-z0-9']+", text)


def word_edit_distance(a: list[str], b: list[str]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


# -- audio ---------------------------------------------------------------------


def read_wav(path: Path) -> np.ndarray:
    from voice.audio.wav import read_mono16k

    return read_mono16k(path)


def last_loud(samples: np.ndarray) -> int:
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > LOUD)
    return int(loud[-1]) if len(loud) else 0


def first_loud(samples: np.ndarray) -> int:
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > LOUD)
    return int(loud[0]) if len(loud) else 0


@cache
def scorer():
    """The independent transcriber: faster-whisper base with word timestamps."""
    from voice.speech.stt import WhisperEngine

    return WhisperEngine("base")


def heard_words(audio: np.ndarray) -> list[str]:
    """Words faster-whisper base places wholly inside `audio` (int16), padded
    with 0.3 s of silence each side (the method of tests/test_voice_replay.py)."""
    pad = np.zeros(RATE * 3 // 10, np.int16)
    x = np.concatenate([pad, audio.astype(np.int16), pad]).astype(np.float32) / 32768
    cut = (len(pad) + len(audio)) / RATE
    return [w for w, _, end in scorer().words(x) if end <= cut + 0.02]


def prefix_error(delivered: str, audio: np.ndarray) -> tuple[int, list[str]]:
    heard = words(" ".join(heard_words(audio)))
    return word_edit_distance(words(delivered), heard), heard


# -- replays ---------------------------------------------------------------------


def run_replay(scenario: Path, out: Path, *, stt_model: str | None = None, config: Path | None = None,
               realtime: bool = False, timeout: float = 300) -> dict[str, Any]:
    if out.is_dir():  # the benchmark's own folder from an earlier run (--keep): voice replay wants it new or empty
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "voice", "replay", str(scenario), "--out", str(out)]
    if stt_model:
        cmd += ["--stt-model", stt_model]
    if config:
        cmd += ["--config", str(config)]
    if realtime:
        cmd.append("--realtime")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(out.parent / "xdg-config")}
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"voice replay {scenario.name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    summary["_process_wall_s"] = time.perf_counter() - started
    summary["_stdout"] = proc.stdout
    return summary


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for key, dist in (("pipecat", "pipecat-ai"), ("faster-whisper", "faster-whisper"), ("piper", "piper-tts"),
                      ("voice", "voice"), ("ctranslate2", "ctranslate2"), ("onnxruntime", "onnxruntime")):
        try:
            out[key] = version(dist)
        except PackageNotFoundError:
            out[key] = "missing"
    return out


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu_model": model, "platform": sys.platform}
