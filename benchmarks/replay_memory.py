"""`voice replay` over a long scenario: does its memory stay flat?

`python benchmarks/replay_memory.py [--turns 400] [--keep DIR] [--code DIR]`
writes a scenario of TURNS spoken turns from the real human recordings of
tests/fixtures/audio/human (as benchmarks/soak.py chooses them: whole
utterances as requests, every tenth a fragment that barges in 1.0 s into
the reply), with scripted replies (the soak's, cycling) and faster-whisper
tiny.en, and runs `voice replay` on it in a process of its own. Every half
second it reads that process's RSS (/proc) and how many turns have ended
(`turn/end` rows in its events.db), and prints the RSS at turn 100 and at
the end, and the medians over the 50 turns from turn 100 and over the last
50 (RSS swings by tens of MB from one turn to the next as the models' large
buffers come and go: two single samples say little about growth). Issue
#27's target: flat within 10 MB from turn 100 to the end of a 400-turn
replay.

`--code DIR` runs the replay of another tree's `voice` (DIR holds the
package), so a before/after comparison runs the same scenario. Run it
alone and niced; say how loaded the machine was (`uptime`). It is a
measurement, not a test: nothing here fails on a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from soak import HUMAN, REPLIES, human_clips

ROOT = Path(__file__).resolve().parents[1]
WARM_UP = 100
WINDOW = 50


def write_scenario(turns: int, directory: Path) -> Path:
    requests, barge = human_clips()
    users = [f'[[user]]\naudio = "{HUMAN / requests[0]["file"]}"\nat = 0.5\n']
    for n in range(1, turns):
        if n % 10 == 9:
            users.append(f'[[user]]\naudio = "{HUMAN / barge[n % len(barge)]["file"]}"\nbarge_in_after = 1.0\n')
        else:  # after_idle: a barge-in heard as nothing is answered by nothing, and the next request still comes
            users.append(f'[[user]]\naudio = "{HUMAN / requests[n % len(requests)]["file"]}"\nafter_idle = 0.5\n')
    replies = [f'[[reply]]\nchunk_delay_ms = 30\ntext = "{REPLIES[n % len(REPLIES)]}"\n' for n in range(2 * turns)]  # a barge-in may ask twice
    path = directory / "long.toml"
    path.write_text(f'stt_model = "tiny.en"\ntiming = "recorded"\nmax_duration = {turns * 60}\n\n'
                    + "\n".join(users) + "\n" + "\n".join(replies))
    return path


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def turns_ended(db: Path) -> int:
    if not db.is_file():
        return 0
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0)
        try:
            return con.execute("SELECT COUNT(*) FROM events WHERE type = 'turn/end'").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:  # being written: the next look reads it
        return -1


def measure(turns: int, work: Path, code: Path) -> dict:
    scenario = write_scenario(turns, work)
    out = work / "out"
    if out.is_dir():  # an earlier run's (--keep): voice replay wants a new or empty folder
        shutil.rmtree(out)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(work / "xdg-config"),
           "PYTHONPATH": str(code)}
    started = time.perf_counter()
    # cwd: the work folder, so that PYTHONPATH (not the current folder) decides which `voice` runs
    proc = subprocess.Popen([sys.executable, "-m", "voice", "replay", str(scenario), "--out", str(out)],
                            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    by_turn: dict[int, float] = {}  # turns ended -> RSS then (MB), the first look at that count
    while proc.poll() is None:
        rss, n = rss_mb(proc.pid), turns_ended(out / "events.db")
        if rss is not None:
            if n >= 0 and n not in by_turn:
                by_turn[n] = rss
                if n % 50 == 0 and n:
                    print(f"replay_memory: {n} turns, rss {rss:.1f} MB, {time.perf_counter() - started:.0f} s",
                          file=sys.stderr, flush=True)
        time.sleep(0.5)
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        print(stderr[-3000:], file=sys.stderr)
    ended = max(by_turn, default=0)
    last = by_turn.get(ended)  # at the last turn's end (after it, the models are let go)
    after_warm = [v for k, v in by_turn.items() if WARM_UP <= k < WARM_UP + WINDOW]
    tail = [v for k, v in by_turn.items() if k > ended - WINDOW]
    at_warm = next((by_turn[k] for k in sorted(by_turn) if k >= WARM_UP), None)
    result = {
        "turns": turns, "turns_ended": ended, "rc": proc.returncode, "wall_s": round(time.perf_counter() - started, 1),
        "rss_mb_turn_100": at_warm and round(at_warm, 1), "rss_mb_end": last and round(last, 1),
        "rss_mb_median_from_100": round(statistics.median(after_warm), 1) if after_warm else None,
        "rss_mb_median_last": round(statistics.median(tail), 1) if tail else None,
        "rss_mb_peak": round(max(by_turn.values(), default=0.0), 1),
        "audio_s": None, "code": str(code), "load": os.getloadavg(),
    }
    if result["rss_mb_median_from_100"] is not None and result["rss_mb_median_last"] is not None:
        result["growth_mb_medians"] = round(result["rss_mb_median_last"] - result["rss_mb_median_from_100"], 1)
    if at_warm is not None and last is not None:
        result["growth_mb_turn_100_to_end"] = round(last - at_warm, 1)
    if (out / "summary.json").is_file():
        result["audio_s"] = json.loads((out / "summary.json").read_text())["device"]["duration_s"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--keep", type=Path, default=None, help="a folder for the scenario and the replay's output")
    parser.add_argument("--code", type=Path, default=ROOT, help="the tree whose `voice` replays (default: this one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="voice-replay-memory-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = measure(args.turns, work, args.code.resolve())
    print(json.dumps(result, indent=2))
    return 0 if result["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
