"""The cost of one EventStore.append (WAL, synchronous=NORMAL): median and
p95 microseconds over 2000 appends with realistic payloads.

    python benchmarks/log_append.py [--n 2000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from voice.log import events as ev  # noqa: E402
from voice.log.store import EventStore  # noqa: E402


def payloads(i: int) -> tuple[str, dict]:
    """A realistic mix: the shapes a voice turn writes."""
    route = {"provider": "openai", "model": "llama3.2", "base_url": "http://127.0.0.1:11434/v1"}
    text = "First, the sea covers most of the planet. Second, it holds nearly all of the water on Earth."
    kinds = [
        (ev.USER_MESSAGE, {"content": "Give me three points about the sea.", "source": "voice"}),
        (ev.ASSISTANT_MESSAGE, {"message_id": f"{i}.0.0", "content": [{"type": "text", "text": text}], "route": route,
                                "finish_reason": "stop",
                                "stream": [[round(j * 40.1, 1), "text", w] for j, w in enumerate(text.split())]}),
        (ev.SPEECH_PLAYED, {"message_id": f"{i}.0.0", "chars": 52, "words": 9, "samples": 52000, "complete": False}),
        (ev.STEP_END, {"outcome": "completed"}),
    ]
    return kinds[i % len(kinds)]


def measure(n: int = 2000) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        store = EventStore(Path(tmp) / "events.db")
        try:
            mode = store._db.execute("PRAGMA journal_mode").fetchone()[0]
            sync = store._db.execute("PRAGMA synchronous").fetchone()[0]
            for i in range(50):  # warm up
                t, p = payloads(i)
                store.append("c-warm", t, p, turn=1, step=0, attempt=0)
            times = []
            for i in range(n):
                t, p = payloads(i)
                t0 = time.perf_counter()
                store.append("c-bench", t, p, turn=1 + i // 4, step=0, attempt=0)
                times.append((time.perf_counter() - t0) * 1e6)
        finally:
            store.close()
    a = np.array(times)
    return {"n": n, "append_us_p50": float(np.percentile(a, 50)), "append_us_p95": float(np.percentile(a, 95)),
            "append_us_p99": float(np.percentile(a, 99)), "append_us_max": float(a.max()),
            "journal_mode": mode, "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(sync, sync)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args()
    r = measure(args.n)
    print(f"EventStore.append over {r['n']} appends (journal_mode={r['journal_mode']}, synchronous={r['synchronous']}): "
          f"median {r['append_us_p50']:.0f} µs, p95 {r['append_us_p95']:.0f} µs, p99 {r['append_us_p99']:.0f} µs, "
          f"max {r['append_us_max']:.0f} µs")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
