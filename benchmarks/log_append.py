"""The cost of the durable log: one EventStore.record (WAL), median and p95
microseconds, for ordinary events (synchronous=NORMAL: no fsync) and for
the events an effect depends on (`DURABLE_TYPES`, synchronous=FULL: the WAL
is fsync'd before the append returns, e.g. `tool/dispatch` before the tool
starts); the whole log of one turn with a write; and opening a large log,
whose integrity check (`PRAGMA quick_check`) reads every page.

    python benchmarks/log_append.py [--n 2000] [--open-events 200000] [--dir DIR] [--json OUT]

Run it on the filesystem that holds the real log (--dir): an fsync costs
what the disk makes it cost.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from voice.log import events as ev  # noqa: E402
from voice.log.store import EventStore  # noqa: E402

ROUTE = {"provider": "openai", "model": "llama3.2", "base_url": "http://127.0.0.1:11434/v1"}
TEXT = "First, the sea covers most of the planet. Second, it holds nearly all of the water on Earth."


def payloads(i: int) -> tuple[str, dict]:
    """A realistic mix: the shapes a voice turn writes."""
    kinds = [
        (ev.USER_MESSAGE, {"content": "Give me three points about the sea.", "source": "voice"}),
        (ev.ASSISTANT_MESSAGE, {"message_id": f"{i}.0.0", "content": [{"type": "text", "text": TEXT}], "route": ROUTE,
                                "finish_reason": "stop",
                                "stream": [[round(j * 40.1, 1), "text", w] for j, w in enumerate(TEXT.split())]}),
        (ev.SPEECH_PLAYED, {"message_id": f"{i}.0.0", "chars": 52, "words": 9, "samples": 52000, "complete": False}),
        (ev.STEP_END, {"outcome": "completed"}),
    ]
    return kinds[i % len(kinds)]


def dispatch(i: int) -> dict:
    return {"tool_call_id": f"call_{i}_0_0_0", "name": "add_note", "effect": "write", "arguments": {"text": "buy milk"}}


def turn_with_a_write(i: int) -> list[tuple[str, dict]]:
    """The events of one turn that saves a note, in order (ev.DURABLE_TYPES
    among them commit with an fsync)."""
    call = {"tool_call_id": f"call_{i}_0_0_0", "name": "add_note"}
    return [
        (ev.USER_MESSAGE, {"content": "add a note buy milk", "source": "voice"}),
        (ev.STEP_START, {"route": ROUTE}),
        (ev.ASSISTANT_STREAM, {"frame": "start", "route": ROUTE}),
        (ev.ASSISTANT_MESSAGE, {"message_id": f"{i}.0.0", "content": [], "route": ROUTE, "finish_reason": "tool_calls",
                                "tool_calls": [{"id": call["tool_call_id"], "type": "function",
                                                "function": {"name": "add_note", "arguments": '{"text": "buy milk"}'}}]}),
        (ev.ASSISTANT_STREAM, {"frame": "end", "finish_reason": "tool_calls"}),
        (ev.TOOL_CALL, {**call, "arguments": '{"text": "buy milk"}'}),
        (ev.TOOL_DISPATCH, dispatch(i)),
        (ev.EFFECT_RECEIPT, {**call, "phase": "dispatch", "state": "confirmed", "evidence": {"offset": 0, "length": 29}}),
        (ev.TOOL_RESULT, {**call, "status": "ok", "content": {"saved": True}, "receipt": "confirmed"}),
        (ev.ASSISTANT_MESSAGE, {"message_id": f"{i}.0.0.1", "content": [{"type": "text", "text": "Done."}]}),
        (ev.STEP_END, {"outcome": "tool_calls"}),
        (ev.SPEECH_PLAYED, {"message_id": f"{i}.0.0.1", "chars": 5, "words": 1, "samples": 9000, "complete": True}),
        (ev.TURN_END, {"outcome": "completed"}),
    ]


def _stats(times: list[float], unit: str) -> dict:
    a = np.array(times)
    return {f"{unit}_p50": float(np.percentile(a, 50)), f"{unit}_p95": float(np.percentile(a, 95)),
            f"{unit}_p99": float(np.percentile(a, 99)), f"{unit}_max": float(a.max())}


def record(store: EventStore, conversation: str, type_: str, payload: dict, **at) -> None:
    """One row through the store's one recording path, as its body."""
    store.record(conversation, ev.BODIES[type_].from_payload(payload), **at)


def measure_appends(folder: Path, n: int) -> dict:
    store = EventStore(folder / "appends.db")
    try:
        mode = store._db.execute("PRAGMA journal_mode").fetchone()[0]
        sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[store._db.execute("PRAGMA synchronous").fetchone()[0]]
        for i in range(50):  # warm up
            t, p = payloads(i)
            record(store, "c-warm", t, p, turn=1, step=0, attempt=0)
        plain, durable, turns = [], [], []
        for i in range(n):
            t, p = payloads(i)
            t0 = time.perf_counter()
            record(store, "c-bench", t, p, turn=1 + i // 4, step=0, attempt=0)
            plain.append((time.perf_counter() - t0) * 1e6)
            t0 = time.perf_counter()
            record(store, "c-bench", ev.TOOL_DISPATCH, dispatch(i), turn=1 + i // 4, step=0, attempt=0)
            durable.append((time.perf_counter() - t0) * 1e6)
        for i in range(max(20, n // 20)):
            turn = store.start_turn("c-turns", ev.TurnStart(source="voice"))
            t0 = time.perf_counter()
            for t, p in turn_with_a_write(turn):
                step = None if t == ev.TURN_END else 0
                record(store, "c-turns", t, p, turn=turn, step=step, attempt=step)
            turns.append((time.perf_counter() - t0) * 1e3)
    finally:
        store.close()
    return {"n": n, "journal_mode": mode, "synchronous": sync, **_stats(plain, "append_us"),
            "durable": {"synchronous": "FULL", **_stats(durable, "append_us")},
            "turn_with_a_write": {**_stats(turns, "ms"), "events": len(turn_with_a_write(0)),
                                  "durable_events": sum(t in ev.DURABLE_TYPES for t, _ in turn_with_a_write(0))}}


def measure_open(folder: Path, events: int) -> dict:
    """Time to open a log of `events` events: EventStore (quick_check
    included) against a bare connection that checks nothing."""
    path = folder / "large.db"
    EventStore(path).close()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    rows = []
    for i in range(events):
        t, p = payloads(i)
        rows.append(("c-large", 1 + i // 16, 0, 0, t, ev.encode_payload(p), 0.0, 0.0))
    db.executemany("INSERT INTO events(conversation, turn, step, attempt, type, payload, at_mono, at_wall)"
                   " VALUES (?,?,?,?,?,?,?,?)", rows)
    db.execute("COMMIT")
    db.close()
    size_mb = path.stat().st_size / 1e6
    checked, bare = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        EventStore(path).close()
        checked.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        db = sqlite3.connect(path)
        db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        db.close()
        bare.append((time.perf_counter() - t0) * 1e3)
    return {"events": events, "size_mb": round(size_mb, 1), "open_checked_ms_p50": float(np.median(checked)),
            "open_bare_ms_p50": float(np.median(bare))}


def measure(n: int = 2000, open_events: int = 0, folder: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        result = measure_appends(Path(tmp), n)
        if open_events:
            result["open"] = measure_open(Path(tmp), open_events)
        result["dir"] = str(Path(tmp).parent)
    return result


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--open-events", type=int, default=200_000, help="events in the large log (0: skip)")
    p.add_argument("--dir", help="where the logs are made (default: the temporary folder)")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args()
    r = measure(args.n, args.open_events, args.dir)
    for kind, s in (("ordinary", r), ("durable", r["durable"])):
        print(f"EventStore.record, synchronous={s['synchronous']} ({kind}), {r['n']} appends in {r['dir']}: median "
              f"{s['append_us_p50']:.0f} µs, p95 {s['append_us_p95']:.0f} µs, p99 {s['append_us_p99']:.0f} µs, "
              f"max {s['append_us_max']:.0f} µs")
    t = r["turn_with_a_write"]
    print(f"one turn with a write ({t['events']} events, {t['durable_events']} durable): median {t['ms_p50']:.1f} ms, "
          f"p95 {t['ms_p95']:.1f} ms")
    if "open" in r:
        o = r["open"]
        print(f"opening a log of {o['events']} events ({o['size_mb']} MB): {o['open_checked_ms_p50']:.0f} ms with "
              f"the integrity check, {o['open_bare_ms_p50']:.1f} ms bare")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
