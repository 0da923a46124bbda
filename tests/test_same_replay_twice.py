"""The same text gives the same voice, so the same recorded session replays the
same way twice. Before Piper's noise was seeded (voice/speech/piper_graph.py),
one sentence came out a few hundred samples longer or shorter from run to run,
and `voice replay` of the receipts scenario on `timing = "recorded"` wrote a
played.wav 17.4 s long once and 15.4 s the next time, with a different ending."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from voice.log.store import EventStore
from voice.speech.tts import PiperEngine

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "tests" / "fixtures" / "scenarios"


@pytest.mark.slow  # two Piper voices loaded
def test_two_voices_say_one_sentence_alike_and_a_long_one_whole():
    text = "Saturn is the sixth planet from the Sun, and the second largest."
    first, second = PiperEngine(16000), PiperEngine(16000)
    a, b, again = first.synthesize(text), second.synthesize(text), first.synthesize(text)
    assert a.samples.tobytes() == b.samples.tobytes() == again.samples.tobytes()
    assert a.words == b.words == again.words and a.method == b.method
    # A sentence longer than the fixed noise (about 12 s of latent) still synthesizes, whole.
    long = " ".join(["this sentence goes on and on without a stop"] * 12) + "."
    audio = first.synthesize(long)
    assert len(audio.samples) / 16000 > 15 and len(audio.words) == len(long.split())


def _replay(scenario: Path, out: Path) -> Path:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(out / "config")}
    proc = subprocess.run([sys.executable, "-m", "voice", "replay", str(scenario), "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _what_happened(out: Path) -> tuple[list, list]:
    """Each row's type and turn, and each turn's figures: what a person can
    compare, without the ids and wall-clock stamps that differ by design."""
    store = EventStore(out / "events.db")
    try:
        rows = [(e.type, e.turn) for e in store.events()]
    finally:
        store.close()
    turns = json.loads((out / "summary.json").read_text())["turns"]
    ordinal = {c: n for n, c in enumerate(dict.fromkeys(t["conversation"] for t in turns))}  # ids are random
    return rows, [{**t, "conversation": ordinal[t["conversation"]]} for t in turns]


@pytest.mark.slow
def test_a_recorded_session_replays_to_the_same_audio_and_log_twice(tmp_path):
    source = (SCENARIOS / "receipts.toml").read_text()
    scenario = tmp_path / "receipts.toml"
    assert 'timing = "recorded"' in source  # (every scenario the tests replay is)
    scenario.write_text(source.replace("../audio/", f"{SCENARIOS.parent / 'audio'}/"))
    one, two = _replay(scenario, tmp_path / "one"), _replay(scenario, tmp_path / "two")
    for name in ("mic.wav", "played.wav"):
        digests = {hashlib.sha256((out / name).read_bytes()).hexdigest() for out in (one, two)}
        assert len(digests) == 1, f"{name} differs between two replays of one recorded session"
    assert _what_happened(one) == _what_happened(two)
