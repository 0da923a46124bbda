"""Device faults: the audio server killed and started again, over and over,
under one running `voice run` (issue #36):

    python benchmarks/device_faults.py [--cycles 20] [--seed 1] [--json OUT] [--keep DIR]

On the live tests' private PipeWire (tests/live/audio_server.py), `voice
run` in open mode with the scripted model (tests/live/conversation.py's
`LiveDaemon`). Each cycle picks where the kill falls: *idle* (1-4 s of
nothing), *listening* (0.2-1.2 s into a spoken request) or *mid-reply*
(0.3-2.5 s after the reply's first sample reached the speaker), each
three cycles the three in a random order, the moments at random; pipewire, wireplumber and pipewire-pulse are killed, stay away
0.5-3 s, and are started again with the same virtual devices as the
defaults. From the server's return (its socket there again) it measures:

- to listening: the `audio/back` row (written at the first mic block of
  the reopened stream);
- to answered: "What time is it?" is played into the mic as soon as the
  log says audio is back; the first sample of the answer on
  `speaker.monitor`. So it holds the request itself (1.9 s), the end of
  turn, recognition and the reply's start, not only the reopening; the
  request's own share (from its start to the answer) is given beside it;
- what the request was heard as (the words after a return, against the
  same request heard before the first kill);
- deaf: no `audio/back` within `DEAF_S`, or no answer within `ANSWER_S`;
  crashes: `voice run` exited;
- the daemon's RSS, threads and open file descriptors after each cycle,
  once its reply has played out (flat: no stream, thread or socket left
  behind by a reopening).

The machine's load average is kept with the figures: on a shared machine
they move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ["HF_HUB_OFFLINE"] = "1"

from common import machine, stats  # noqa: E402  (benchmarks/, this script's folder)
from live.audio_server import AudioServer, Recorder, ensure_packages  # noqa: E402
from live.conversation import AUDIO, LiveDaemon, first_loud  # noqa: E402

from voice.log import events as ev  # noqa: E402

PHASES = ("idle", "listening", "mid-reply")
REQUEST = AUDIO / "what_time.wav"  # asked after each return
LONG_REQUEST = AUDIO / "three_points.wav"  # asked before a mid-reply kill
# Every request gets this reply (two sentences, about 6 s: room for a kill in its middle).
REPLY = "First, the sea covers most of the planet. Second, it holds nearly all of the water on Earth."
DEAF_S = 20.0  # no mic block this long after the server's return: deaf
ANSWER_S = 30.0  # no answer this long after the request was played: deaf
QUIET_S = 1.5  # the speaker silent this long: the reply has played out


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def script(path: Path, replies: int) -> Path:
    path.write_text(f'[[reply]]\nchunk_delay_ms = 20\ntext = "{REPLY}"\n\n' * replies)
    return path


def query(db: Path, sql: str, args: tuple = ()) -> list[tuple]:
    """Rows of the daemon's log, read while it writes (read-only: this
    process never writes its log)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def rows_after(db: Path, seq: int, types: tuple[str, ...]) -> list[tuple[int, str, float]]:
    """(seq, type, at_mono) of the log's rows of these types after `seq`."""
    marks = ",".join("?" * len(types))
    return query(db, f"SELECT seq, type, at_mono FROM events WHERE seq > ? AND type IN ({marks}) ORDER BY seq",
                 (seq, *types))


def heard_after(db: Path, seq: int) -> list[str]:
    """The words of the requests the log has after `seq`."""
    rows = query(db, "SELECT payload FROM events WHERE seq > ? AND type = ? ORDER BY seq", (seq, ev.USER_MESSAGE))
    return [json.loads(payload).get("content", "") for (payload,) in rows]


def last_seq(db: Path) -> int:
    return query(db, "SELECT COALESCE(MAX(seq), 0) FROM events")[0][0]


def resources(pid: int) -> dict[str, float]:
    """The daemon's resident memory (MB), threads and open file descriptors now."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return {"rss_mb": round(rss_kb / 1024, 1), "threads": len(os.listdir(f"/proc/{pid}/task")),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def until(condition, timeout: float, daemon: LiveDaemon) -> bool:
    """Wait for `condition()`; False on the timeout or when the daemon has exited."""
    deadline = time.monotonic() + timeout
    while not condition():
        if daemon.proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def played_out(speaker: Recorder, after: int) -> bool:
    """Sound came on the speaker after sample `after`, and it has been quiet for QUIET_S since."""
    samples = speaker.samples()
    start = first_loud(samples, after)
    if start is None:
        return False
    tail = samples[-int(QUIET_S * 16000):]
    return len(samples) - start > QUIET_S * 16000 and first_loud(tail) is None


class Bench:
    def __init__(self, server: AudioServer, work: Path, cycles: int, rng: random.Random):
        self.server = server
        self.rng = rng
        self.daemon = LiveDaemon(work / "daemon", server, script(work / "replies.toml", 4 * cycles + 10))
        self.speaker = server.record("speaker.monitor")
        self.cycles: list[dict] = []
        self.samples: list[dict] = []
        self.crashed: int | None = None  # the daemon's exit status, had it exited on its own
        self.players: list = []
        self.order: list[str] = []  # the phases of the cycles still to come in this round of three
        self.warm_up_heard: list[str] = []

    def answer(self, timeout: float = ANSWER_S) -> tuple[float, float] | None:
        """Play the request; (when it was started, when its answer's first
        sample reached the speaker), once that answer has played out; None
        when none came."""
        played_at = time.monotonic()
        start_index = self.speaker.index_at(played_at)
        player = self.server.play(REQUEST)
        came = until(lambda: first_loud(self.speaker.samples(), start_index) is not None, timeout, self.daemon)
        player.wait(10)
        if not came:
            return None
        first = first_loud(self.speaker.samples(), start_index)
        answered_at = self.speaker.time_of(first)
        until(lambda: played_out(self.speaker, first), 40, self.daemon)
        return played_at, answered_at

    def warm_up(self) -> None:
        self.daemon.wait_listening()
        time.sleep(0.5)
        if self.answer(60) is None:
            raise RuntimeError(f"the first request was never answered:\n{self.daemon.log()}")
        self.warm_up_heard = heard_after(self.daemon.db, 0)
        self.samples.append({"cycle": 0, **resources(self.daemon.proc.pid)})

    def cycle(self, n: int) -> dict:
        if not self.order:
            self.order = self.rng.sample(PHASES, len(PHASES))
        phase = self.order.pop()
        down_s = self.rng.uniform(0.5, 3.0)
        seq = last_seq(self.daemon.db)
        if phase == "idle":
            time.sleep(self.rng.uniform(1.0, 4.0))
        elif phase == "listening":
            self.players.append(self.server.play(REQUEST))
            time.sleep(self.rng.uniform(0.2, 1.2))
        else:
            start_index = self.speaker.index_at(time.monotonic())
            self.players.append(self.server.play(LONG_REQUEST))
            if not until(lambda: first_loud(self.speaker.samples(), start_index) is not None, ANSWER_S, self.daemon):
                return {"cycle": n, "phase": phase, "deaf": True, "why": "the reply before the kill never came"}
            time.sleep(self.rng.uniform(0.3, 2.5))
        killed_at = time.monotonic()
        self.server.kill_server()
        self.speaker.stop()  # (parecord ended with the server)
        time.sleep(down_s)
        self.server.restart_server()
        back_at = self.server.socket_at
        self.speaker = self.server.record("speaker.monitor")
        result = {"cycle": n, "phase": phase, "down_s": round(back_at - killed_at, 2), "deaf": False}
        backs: list = []

        def heard_again() -> bool:
            backs[:] = rows_after(self.daemon.db, seq, (ev.AUDIO_BACK,))
            return bool(backs)

        if not until(heard_again, DEAF_S, self.daemon):
            result.update(deaf=True, why=f"no audio/back within {DEAF_S:.0f} s of the server's return")
            return result
        result["to_listening_s"] = round(backs[0][2] - back_at, 3)
        answered = self.answer()
        if answered is None:
            result.update(deaf=True, why=f"the request after the return was not answered within {ANSWER_S:.0f} s")
            return result
        asked_at, answered_at = answered
        result["to_answered_s"] = round(answered_at - back_at, 3)
        result["heard"] = heard_after(self.daemon.db, backs[0][0])
        result["request_to_answer_s"] = round(answered_at - asked_at, 3)
        lost = rows_after(self.daemon.db, seq, (ev.AUDIO_LOST,))
        result["lost_rows"] = len(lost)
        result["known_after_s"] = round(lost[0][2] - killed_at, 3) if lost else None
        self.samples.append({"cycle": n, **resources(self.daemon.proc.pid)})
        return result

    def run(self, cycles: int) -> None:
        self.warm_up()
        for n in range(1, cycles + 1):
            r = self.cycle(n)
            for player in self.players:  # (those the kill cut short end with it)
                player.wait(10)
            self.players.clear()
            self.cycles.append(r)
            if self.daemon.proc.poll() is not None:
                self.crashed = self.daemon.proc.returncode
                log(f"cycle {n}: voice run exited ({self.crashed})")
                break
            log(f"cycle {n}: {r['phase']:9} " + ("DEAF: " + r["why"] if r.get("deaf") else
                f"listening {r['to_listening_s']:.2f} s, answered {r['to_answered_s']:.2f} s after the return; "
                f"heard {r['heard']}"))

    def close(self) -> int:
        self.speaker.stop()
        return self.daemon.stop()


def summary(bench: Bench, rc: int, load: tuple[list[float], list[float]]) -> dict:
    done = [c for c in bench.cycles if not c.get("deaf")]
    series = {key: [s[key] for s in bench.samples] for key in ("rss_mb", "threads", "fds")}
    return {
        "cycles": len(bench.cycles),
        "phases": {p: sum(1 for c in bench.cycles if c["phase"] == p) for p in PHASES},
        "to_listening_s": stats([c["to_listening_s"] for c in done]),
        "to_answered_s": stats([c["to_answered_s"] for c in done]),
        "request_to_answer_s": stats([c["request_to_answer_s"] for c in done]),
        "known_after_kill_s": stats([c["known_after_s"] for c in done if c.get("known_after_s") is not None]),
        "warm_up_heard": bench.warm_up_heard,
        "heard_as_asked": sum(1 for c in done if any("what time is it" in h.lower() for h in c["heard"])),
        "deaf_cycles": sum(1 for c in bench.cycles if c.get("deaf")),
        "crashes": 0 if bench.crashed is None else 1,
        "exit_code": rc,  # of `voice run` stopped with SIGTERM at the end (or its own, after a crash)
        "resources": {key: {"after_warm_up": vals[0], "after_last": vals[-1], "min": min(vals), "max": max(vals),
                            "series": vals} for key, vals in series.items() if vals},
        "load_avg_at_start": load[0],
        "load_avg_at_end": load[1],
        "per_cycle": bench.cycles,
        "machine": machine(),
    }


def print_summary(r: dict) -> None:
    def fig(s: dict) -> str:
        return "n/a" if not s["n"] else f"p50 {s['p50']:.2f} s, p95 {s['p95']:.2f} s, max {s['max']:.2f} s (n={s['n']})"

    res = r["resources"]
    print(f"device faults: {r['cycles']} cycles ({', '.join(f'{n} {p}' for p, n in r['phases'].items())}); "
          f"load average {r['load_avg_at_start'][0]:.1f} at the start, {r['load_avg_at_end'][0]:.1f} at the end")
    print(f"  server's return -> listening (first mic block): {fig(r['to_listening_s'])}; target p95 <= 2 s")
    print(f"  server's return -> answer's first sample on the speaker: {fig(r['to_answered_s'])}")
    print(f"    of which the request's start -> the answer: {fig(r['request_to_answer_s'])}")
    print(f"  kill -> loss known: {fig(r['known_after_kill_s'])}")
    print(f"  the request after a return heard as \"What time is it?\" in {r['heard_as_asked']} of "
          f"{r['to_answered_s']['n']} cycles (before the first kill: {r['warm_up_heard']})")
    print(f"  deaf cycles: {r['deaf_cycles']}; crashes: {r['crashes']}; exit code {r['exit_code']}")
    for key, unit in (("rss_mb", "MB"), ("threads", ""), ("fds", "")):
        if key in res:
            v = res[key]
            print(f"  {key}: {v['after_warm_up']} {unit} after warm-up -> {v['after_last']} {unit} after the last "
                  f"cycle (min {v['min']}, max {v['max']})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", type=Path, help="keep the daemon's log and output here")
    args = ap.parse_args()
    if args.cycles < 1:
        ap.error(f"--cycles {args.cycles}: give at least 1")
    reason = ensure_packages()
    if reason is not None:
        log(f"device faults benchmark: {reason}")
        return 2
    work = args.keep or Path(tempfile.mkdtemp(prefix="voice-device-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    load_start = list(os.getloadavg())
    with AudioServer() as server:
        bench = Bench(server, work, args.cycles, random.Random(args.seed))
        try:
            bench.run(args.cycles)
        finally:
            rc = bench.close()
            (work / "daemon.log").write_text(bench.daemon.log())
    result = summary(bench, rc, (load_start, list(os.getloadavg())))
    result["seed"] = args.seed
    print_summary(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    ok = result["deaf_cycles"] == 0 and result["crashes"] == 0 and rc == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
