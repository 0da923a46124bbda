"""idle_cpu_pct and peak_rss_mb: `voice replay --realtime` on a scenario with
one short exchange and then a long silent tail (`tail = N`): the pipeline
listens to silence at real-time pace.

idle_cpu_pct is sampled from /proc/PID/stat (utime+stime) over a window
inside the silent tail (starting 3 s after the reply was printed, so the
reply's playback has ended); the whole-process figure from os.wait4's rusage
((utime+stime)/wall, including model loading) is reported too, as is
ru_maxrss (peak RSS)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import AUDIO, ROOT

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (after the state field)


def measure(workdir: Path, tail: float = 20.0, stt_model: str | None = None) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    scen = workdir / "idle.toml"
    scen.write_text(f'tail = {tail}\n[[user]]\naudio = "{AUDIO / "what_time.wav"}"\nat = 0.3\n\n'
                    f'[[reply]]\nchunk_delay_ms = 20\ntext = "It is noon."\n')
    out = workdir / "out"
    cmd = [sys.executable, "-m", "voice", "replay", str(scen), "--out", str(out), "--realtime"]
    if stt_model:
        cmd += ["--stt-model", stt_model]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(workdir / "xdg")}
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    replied = threading.Event()
    lines: list[str] = []

    def read():
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("assistant:"):
                replied.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    window = max(2.0, tail - 6.0)
    idle_pct = None
    if replied.wait(timeout=180):
        time.sleep(3.0)
        c0, t0 = _cpu_s(proc.pid), time.perf_counter()
        time.sleep(window)
        c1, t1 = _cpu_s(proc.pid), time.perf_counter()
        if c0 is not None and c1 is not None:
            idle_pct = (c1 - c0) / (t1 - t0) * 100
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    reader.join(timeout=5)
    if status != 0:
        raise RuntimeError(f"idle replay failed (status {status}): {''.join(lines)[-2000:]}")
    return {
        "idle_cpu_pct": idle_pct,
        "idle_window_s": window,
        "whole_process_cpu_pct": (usage.ru_utime + usage.ru_stime) / wall * 100,
        "whole_process_wall_s": wall,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "stt_model": stt_model or "base (config default)",
    }


if __name__ == "__main__":
    import json
    import tempfile

    print(json.dumps(measure(Path(tempfile.mkdtemp()), tail=8), indent=1))
