"""benchmarks/soak.py in its smoke size, so it cannot rot: a few turns of
real recordings through the real pipeline (whisper tiny.en, piper), a
barge-in among them. Its structure, not its timings (those are the soak's
own, on a machine left alone: benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_soak_smoke(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--turns", "6", "--no-targets",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=280)  # ~30 s on an idle 2-core machine
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["turns_answered"] == 6  # every request was answered, the barge-in (the fifth) too
    assert result["model_requests"] == 6
    assert result["turns_with_speech"] >= 5 and result["latency_s"]["first_100_mean"] > 0
    largest = result["largest_request"]
    assert 0 < largest["tokens"] <= largest["budget"] and largest["messages"] >= 2
    for key in ("rss_mb", "fds", "threads"):
        assert all(isinstance(v, (int, float)) for v in result[key].values()), key
    assert result["log_bytes_per_turn"] > 0
    assert set(result["checks"]) >= {"rss_growth_le_10mb", "latency_ratio_le_1.05", "requests_within_budget",
                                     "fds_unchanged", "threads_unchanged"}
