"""The benchmark suite's code path, in its tiny mode, so it cannot rot:
one barge-in replay, the termination measurement, a short idle run, the VAD
grid, one peer scenario and the v2v step (one clip); the JSON must hold every
headline key, numeric."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

KEYS = ("ack_ms_p50", "ack_ms_p95", "termination_ms_p95", "termination_resistant_ms_p95",
        "prefix_error_words_mean", "peer_prefix_error_words_mean", "peer_ack_ms_p50", "v2v_ms_p50",
        "replay_speedup", "idle_cpu_pct", "peak_rss_mb")


@dataclass
class Smoke:
    proc: subprocess.CompletedProcess
    work: Path  # its replays' outputs (--keep)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Smoke:
    """`run.py --smoke`, run once for the tests that read what it did."""
    tmp = tmp_path_factory.mktemp("smoke")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--smoke", "--json",
                           str(tmp / "bench.json"), "--keep", str(tmp / "work")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=360)  # ~60 s on an idle 2-core machine, 140 s at load 4
    return Smoke(proc, tmp / "work")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_benchmark_smoke(smoke):
    proc = smoke.proc
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((smoke.work.parent / "bench.json").read_text())
    for key in KEYS:
        assert isinstance(result.get(key), (int, float)) and not isinstance(result[key], bool), (key, result.get(key))
        assert math.isfinite(result[key]), key
    assert result["termination_resistant_ms_p95"] >= 1000  # the SIGKILL bound (kill_after_s = 2.0) was exercised
    assert result["machine"]["cores"] and result["versions"]["pipecat"]
    assert "| ack_ms" in proc.stdout
    # The v2v step as run.py runs it, into a folder run.py has not made (#26: --quick died there).
    [v2v] = result["v2v"]["rows"]
    assert v2v["tag"] == "tiny.en-ttft0-early" and v2v["turns"] == 1 and v2v["v2v_ms"]["n"] == 1
    assert isinstance(result["v2v_tiny_en_ttft0_early_p50"], float) and "v2v_ms (tiny.en, TTFT 0 ms" in proc.stdout


def test_log_append_benchmark_runs(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "log_append.py"), "--n", "200",
                           "--open-events", "2000", "--json", str(tmp_path / "a.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    r = json.loads((tmp_path / "a.json").read_text())
    assert r["journal_mode"] == "wal" and r["synchronous"] == "NORMAL" and r["append_us_p50"] > 0
    assert r["durable"]["synchronous"] == "FULL" and r["durable"]["append_us_p50"] > 0
    assert r["turn_with_a_write"]["durable_events"] >= 3 and r["open"]["open_checked_ms_p50"] > 0


@pytest.mark.slow
def test_v2v_benchmark_runs(tmp_path):
    """benchmarks/v2v.py's code path (run.py runs it outside --smoke): one
    replay of two clips, one human, with the early end of turn; each turn
    has its v2v parts, none was split, and the speculations are counted."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import v2v

    row = v2v.run(tmp_path, "tiny.en", 0, True, ["what_time.wav", "cmu_go_forward.wav"], log=lambda *a: None)
    assert row["turns"] == 2 and row["false_splits"] == 0 and row["v2v_ms"]["n"] == 2
    assert all(isinstance(v, float) and v >= 0 for k, v in row["parts_p50"].items() if k != "first_token_ms")
    assert row["speculations"]["speculations"] >= row["speculations"]["used"] >= 1


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_run_py_v2v_step_makes_its_own_folder(smoke):
    """#26: `run.py --quick` died at its end, FileNotFoundError on
    work/v2v/tiny.en-ttft0-early.toml: run.py hands v2v.py a folder it has not
    made. The step as run.py runs it, at its smoke size (one clip, tiny.en,
    the scripted model): read from the smoke run's own outputs (#37: the
    step is one replay, run once), whose --keep folder run.py makes and
    work/v2v in it it does not."""
    assert smoke.proc.returncode == 0, smoke.proc.stderr[-3000:]
    [row] = json.loads((smoke.work.parent / "bench.json").read_text())["v2v"]["rows"]
    assert row["tag"] == "tiny.en-ttft0-early" and row["turns"] == 1 and row["v2v_ms"]["n"] == 1
    assert (smoke.work / "v2v" / "tiny.en-ttft0-early" / "events.db").is_file()


@pytest.mark.slow
def test_mcp_orphans_benchmark_runs(tmp_path):
    """benchmarks/mcp_orphans.py at its smallest: one kill -9 per wrapper, one
    stop each; the wrappers that cannot run here say why, and none left an orphan."""
    out = tmp_path / "orphans.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "mcp_orphans.py"), "--crashes", "1", "--stops", "1",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert set(r["kill_9"]) == {"shell", "shell+setsid", "npx", "uvx"}
    for name, row in r["kill_9"].items():
        assert "skipped" in row or (row["orphans"], row["crashes"]) == (0, 1), (name, row)
    assert [row["left_after_stop"] for row in r["stop"].values()] == [0, 0, 0]


@pytest.mark.slow
@pytest.mark.llm_server
@pytest.mark.timeout(300)
def test_llm_v2v_prints_where_each_millisecond_goes(tmp_path):
    """#38.5: benchmarks/llm_v2v.py against llama-server, at its smallest (one
    clip, tiny.en, replies cut at 16 tokens), prints each turn's waterfall
    (end of speech -> speculative words -> early request -> first token ->
    first sentence -> its audio ready -> commit -> first sample played) read
    from the log, its stamps in their order of causes, and the summary per
    stage with the early starts used and dropped and what they cost. The
    end-of-turn wait is 3 s, so the early start runs under it even on a
    loaded machine (Whisper and the model slow)."""
    from llm_server import LLAMA_SERVER, missing

    if (why := missing(LLAMA_SERVER)) is not None:
        pytest.skip(f"no {LLAMA_SERVER}: {why}")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from waterfall import CHAIN, STAGES, monotone

    out = tmp_path / "v2v.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "llm_v2v.py"), "--server", LLAMA_SERVER,
                           "--stt-model", "tiny.en", "--clips", "what_time.wav", "--reply-tokens", "16",
                           "--turn-end-s", "3", "--json",
                           str(out)], cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [turn] = json.loads(out.read_text())["turns"]
    row = turn["waterfall"]
    assert turn["early_used"] == turn["early_starts"] == 1 and row["early"], (turn, row)
    for stage in STAGES:
        assert isinstance(row[stage], float), (stage, row)
    assert monotone(row), row
    assert row["words"] <= row["request"] < row["commit"] and row["overlap_ms"] > 0, row
    # At or after the commit, never before: where the first sentence's audio was ready under the wait (#38.3), its
    # first sample plays in the block of the commit, the same instant on the replay's clock (3,143.2 ms both, once).
    assert row["played"] == turn["v2v_ms"] and row["commit"] <= row["played"], row
    [printed] = [ln for ln in proc.stdout.splitlines() if "waterfall: end of speech 0 ->" in ln]
    stamps = printed.split(" ms  (")[0]
    named = [stage for stage in (*CHAIN, "commit") if f"-> {stage.replace('_', ' ')} " in stamps]
    assert set(named) == {k for k in STAGES if row[k] is not None}, printed
    result = json.loads(out.read_text())
    assert {k for k, s in result["waterfall"].items() if s["n"] == 1} >= {"first_token", "commit", "played"}
    assert "early starts:" in proc.stdout and "dropped" in proc.stdout and "waterfall, ms after the end of speech" in proc.stdout
    assert {"early_starts", "early_used", "early_sentences_dropped_s"} <= set(result["early_start"])
