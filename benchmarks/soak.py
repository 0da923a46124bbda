"""The soak: a month of talking, in a quarter of an hour.

`python benchmarks/soak.py [--turns 1000] [--out DIR]` runs TURNS spoken
turns through the real replay pipeline, in this process, on the replay's
virtual clock: the real human recordings of tests/fixtures/audio/human
(index.json: the whole utterances as requests, the fragments as barge-ins
over a reply), real recognition (faster-whisper tiny.en: the soak measures
the service around the models, and tiny keeps 1,000 turns inside 15
minutes on 2 cores), real synthesis (piper en_US-joe-medium), echo
cancellation as configured, and a scripted model whose replies cycle. Every
fifth request is a barge-in: a fragment spoken 1.0 s into the reply, which
cuts it and is answered (always the same one, JFK's "Ask not": the rotation
`n % len(barge)` at n % 5 == 4 lands on one clip; kept so that the figures
in RESULTS.md stay reproducible). The session is built as `voice run` builds it
(bounded per-turn bookkeeping, a device that keeps no recording).

It reports, and checks against the issue's targets (exit 1 when one fails):
- RSS after warm-up (turn 100) and at the end: growth <= 10 MB, judged on
  the median of the 50 turns from turn 100 against the median of the last
  50 (RSS swings by +-40 MB from one turn to the next as the models' large
  buffers come and go, so two single samples say nothing about growth; both
  single samples are reported too), with the heap's in-use and free parts;
- per-turn latency, end of speech -> first reply sample (device clock),
  first 100 vs last 100 answered turns: ratio of means <= 1.05;
- the largest request (messages, tokens as counted): within the budget;
- log bytes per turn;
- open file descriptors and threads at the start (turn 100) and the end:
  unchanged.

Run it alone: `flock /tmp/voice-bench.lock nice -n 0 python benchmarks/soak.py`
and say how loaded the machine was (`uptime`): the results land in
benchmarks/results-soak.json, and by hand in RESULTS.md.
`--turns 12 --no-targets` is the smoke tests/test_soak_smoke.py runs (its
structure, not its timings).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HUMAN = ROOT / "tests" / "fixtures" / "audio" / "human"
WARM_UP = 100
STALL_S = 60.0
# Two short sentences (about 2.5 s of speech): long enough for a barge-in
# 1.0 s in to cut them, short enough that 1,000 turns fit the time.
REPLIES = (
    "Sure. The tide turns twice a day.",
    "Of course. Honey keeps for years.",
    "Right away. Ten kilometres is six miles.",
    "Good question. Yeast makes bread rise.",
)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@functools.cache
def _mallinfo2() -> Callable[[], Any] | None:
    """glibc's mallinfo2 (2.33 and later), bound once; None elsewhere."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        call = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):  # not glibc, or older than 2.33
        return None
    call.restype = MallInfo2
    return call


def heap_mb() -> tuple[float, float]:
    """glibc's heap: (in use, free but kept) in MB, NaN without glibc. Growth
    of the first is memory held; of the second, fragmentation the allocator
    has not handed back (RSS counts both)."""
    call = _mallinfo2()
    if call is None:
        return float("nan"), float("nan")
    info = call()
    return (info.uordblks + info.hblkhd) / 2**20, info.fordblks / 2**20


def object_census() -> Counter[str]:
    """Live objects the garbage collector tracks, by type."""
    import gc

    gc.collect()
    return Counter(type(o).__qualname__ for o in gc.get_objects())


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def threads() -> int:
    return threading.active_count()


def os_threads() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


def human_clips() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(requests, barge-ins) from the fixtures' index: whole utterances, and fragments made to cut a reply."""
    index = json.loads((HUMAN / "index.json").read_text())
    requests = [f for f in index["files"] if f["kind"] == "utterance" and f["duration_s"] <= 4.0]
    # A barge-in must ask for something, or the scenario's next request waits
    # for a reply that never comes: fragments of two words or more. (Whisper
    # writes "Five, five." as "5, 5", which the barge-in judge, reading only
    # letters, takes for a backchannel; "One." is one.)
    barge = [f for f in index["files"] if f.get("barge_in") and len(f["transcript"].split()) >= 2
             and not any(ch.isdigit() for ch in f["transcript"]) and "five" not in f["transcript"].lower()]
    return requests, barge


def scenario(turns: int):
    """The soak's scenario: `turns` requests, every fifth a barge-in fragment."""
    from voice.audio.replay_device import UserClip
    from voice.audio.wav import read_mono16k
    from voice.service.scenario import Scenario, _onset

    requests, barge = human_clips()
    cache: dict[str, Any] = {}

    def clip(entry: dict[str, Any], when: str, seconds: float) -> UserClip:
        audio = cache.setdefault(entry["file"], read_mono16k(HUMAN / entry["file"]))
        return UserClip(audio, entry["file"], when, seconds, _onset(audio))

    users = [clip(requests[0], "at", 0.5)]
    for n in range(1, turns):
        if n % 5 == 4:
            users.append(clip(barge[n % len(barge)], "barge_in_after", 1.0))
        else:
            # after_idle, not after_reply: a barge-in that Whisper did not catch (heard '' over the
            # reply, under echo cancellation) is answered by nothing, and the next request must still come.
            users.append(clip(requests[n % len(requests)], "after_idle", 0.5))
    return Scenario(Path("soak.toml"), tuple(users), None, None, tail=1.5, max_duration=turns * 60.0,
                    stt_model="tiny.en", listen_mode="open")


@dataclass
class CyclingModel:
    """The scripted model of a soak: its replies, round and round, word by
    word like the scripted provider; of the requests it keeps only the
    largest (a soak must not hold every request it was sent)."""

    chunk_delay_s: float = 0.03
    count: Any = None
    requests: int = 0
    largest: dict[str, Any] = field(default_factory=lambda: {"tokens": 0, "messages": 0})
    route: Any = None

    def __post_init__(self) -> None:
        from voice.agent.providers.base import ProviderRoute

        self.route = ProviderRoute(provider="scripted", model="soak")

    async def stream(self, request):
        import anyio

        from voice.agent.providers.base import Finish, TextDelta
        from voice.agent.providers.scripted import split_words
        from voice.log.window import request_tokens, tools_tokens

        tokens = request_tokens(list(request.messages)) + tools_tokens(list(request.tools))
        if tokens > self.largest["tokens"]:
            self.largest = {"tokens": tokens, "messages": len(request.messages), "request": self.requests + 1}
        self.requests += 1
        for piece in split_words(REPLIES[self.requests % len(REPLIES)]):
            yield TextDelta(piece)
            await anyio.sleep(self.chunk_delay_s)
        yield Finish("stop")

    async def aclose(self) -> None:
        return None


@dataclass
class Sample:
    n: int  # turns answered so far
    turn: int
    latency_s: float | None
    rss_mb: float
    heap_used_mb: float
    heap_free_mb: float
    py_blocks: int  # Python's allocated memory blocks (sys.getallocatedblocks): a leak of ours shows here
    fds: int
    threads: int
    os_threads: int
    log_bytes: int
    wall_s: float


def log_bytes(db: Path) -> int:
    """The log's size in pages as SQLite sees it (the write-ahead log's
    frames included), not the files' (the WAL file only grows until a
    checkpoint, whatever is in it)."""
    import sqlite3

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (pages,) = con.execute("PRAGMA page_count").fetchone()
        (size,) = con.execute("PRAGMA page_size").fetchone()
    finally:
        con.close()
    return pages * size


def run(turns: int, out: Path, max_wall_s: float | None = None) -> dict[str, Any]:
    from voice.audio.clock import VirtualClock, run_on_virtual_clock

    clock = VirtualClock()
    clock.install()
    try:
        return run_on_virtual_clock(_soak(turns, out, max_wall_s), clock)
    finally:
        clock.uninstall()


async def _soak(turns: int, out: Path, max_wall_s: float | None) -> dict[str, Any]:
    import anyio

    from voice.logs import quiet_pipecat

    quiet_pipecat()
    from voice.app import open_app
    from voice.audio.device import MIC_RATE
    from voice.audio.replay_device import ReplayDevice
    from voice.config import load_config
    from voice.log.store import EventStore, new_conversation_id
    from voice.service.replay import SpeechSpans
    from voice.speech.builder import build_voice_session, load_models
    from voice.settings import Settings
    from voice.speech.settings import VoiceSettings

    config = load_config(os.devnull)
    out.mkdir(parents=True, exist_ok=True)
    db = out / "events.db"
    for name in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        name.unlink(missing_ok=True)
    scen = scenario(turns)
    running: list[Any] = []
    device = ReplayDevice(scen, idle=lambda: bool(running) and running[0].idle(), record=False)
    spans = SpeechSpans(device.buffer)
    model = CyclingModel()
    settings = VoiceSettings.from_settings(Settings.from_config(config), listen_mode="open")
    samples: list[Sample] = []
    started = time.perf_counter()
    async with open_app(Settings.from_config(config), store=EventStore(db), llm=model, data_dir=out / "data", recovery=False) as app:
        models = load_models(Settings.from_config(config), MIC_RATE, stt_model="tiny.en", echo_cancellation=config["audio"]["echo_cancellation"],
                             echo_required=False)
        session = build_voice_session(app, device, models, settings, conversation=new_conversation_id(),
                                      transcript=lambda line: None)
        running.append(session)
        seen: set[int] = set()
        census: list[Counter[str]] = []  # object types at warm-up and at the end
        progress = [0]  # device position at the latest answered turn
        scope: list[Any] = []
        stalled: list[str] = []

        async def watch() -> None:
            """After each turn: its latency and the process's figures."""
            while True:
                await anyio.sleep(0.5)
                if max_wall_s is not None and time.perf_counter() - started > max_wall_s:
                    # A loaded machine: end the session (as SIGTERM would) and report what was reached.
                    print(f"soak: --max-wall-s {max_wall_s:g} reached after {len(seen)} turns", file=sys.stderr,
                          flush=True)
                    scope[0].cancel()
                    return
                if device.position - progress[0] > STALL_S * MIC_RATE:
                    p = session.parts
                    stalled.append(f"no turn answered for {STALL_S:g} s of audio after {len(seen)} turns; "
                                   f"{device.clips_placed} of {len(scen.users)} clips placed; idle: {session.idle()} "
                                   f"(speaking {p.listen.speaking}, transcribing {p.transcribe.busy}, waiting "
                                   f"{p.turns.waiting}, agent {p.agent.busy}, playing {p.surface.playing()}, "
                                   f"synthesizing {p.speak.busy})")
                    print(f"soak: stalled: {stalled[0]}", file=sys.stderr, flush=True)
                    scope[0].cancel()
                    return
                for info in list(session.turns):
                    if info.turn < 0 or info.turn in seen:
                        continue
                    seen.add(info.turn)
                    progress[0] = device.position
                    span = spans.of(session.conversation, info.turn)
                    latency = (span[0] - info.utterance_end) / MIC_RATE if span else None
                    samples.append(Sample(len(seen), info.turn, latency, rss_mb(), *heap_mb(), sys.getallocatedblocks(),
                                          open_fds(), threads(), os_threads(), log_bytes(db),
                                          time.perf_counter() - started))
                    if len(seen) % 50 == 0:
                        print(f"soak: {len(seen)} turns, rss {samples[-1].rss_mb:.1f} MB, heap in use "
                              f"{samples[-1].heap_used_mb:.1f} MB, {samples[-1].py_blocks} Python blocks, "
                              f"{samples[-1].wall_s:.0f} s", file=sys.stderr, flush=True)
                    if len(seen) == WARM_UP or len(seen) == turns:
                        census.append(object_census())

        async with anyio.create_task_group() as tg:
            scope.append(tg.cancel_scope)
            tg.start_soon(watch)
            await session.run()
            tg.cancel_scope.cancel()
        budget = app.loop_settings.context_tokens - app.loop_settings.reply_tokens
    wall = time.perf_counter() - started
    result = report(samples, model, budget, wall, device.position / MIC_RATE, turns)
    result["stalled"] = stalled[0] if stalled else None
    if len(census) == 2:  # what grew: the types with the most new objects since warm-up
        grew = census[1] - census[0]
        result["objects_grown"] = dict(grew.most_common(12))
    return result


WINDOW = 50  # turns in each median of the RSS check


def _levels(samples: list[Sample], warm: Sample | None) -> dict[str, tuple[float | None, float | None]]:
    """Median RSS and heap parts over the WINDOW turns from warm-up on, and over the last WINDOW."""
    import statistics

    if warm is None:
        return {k: (None, None) for k in ("rss_mb", "heap_used_mb", "heap_free_mb")}
    first = [s for s in samples if s.n >= warm.n][:WINDOW]
    last = samples[-WINDOW:]
    return {k: (round(statistics.median(getattr(s, k) for s in first), 1),
                round(statistics.median(getattr(s, k) for s in last), 1))
            for k in ("rss_mb", "heap_used_mb", "heap_free_mb")}


def _growth(pair: tuple[float | None, float | None]) -> float | None:
    return None if None in pair else round(pair[1] - pair[0], 1)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def report(samples: list[Sample], model: CyclingModel, budget: int, wall: float, audio_s: float,
           turns: int) -> dict[str, Any]:
    answered = [s for s in samples if s.latency_s is not None]
    first, last = answered[:100], answered[-100:]
    warm = next((s for s in samples if s.n >= min(WARM_UP, max(1, len(samples) // 10))), samples[0] if samples else None)
    end = samples[-1] if samples else None
    result: dict[str, Any] = {
        "turns_scheduled": turns,
        "turns_answered": len(samples),
        "turns_with_speech": len(answered),
        "model_requests": model.requests,
        "wall_s": round(wall, 1),
        "audio_s": round(audio_s, 1),
        "warm_up_turn": warm.n if warm else None,
        "rss_mb": {"warm": round(warm.rss_mb, 1) if warm else None, "end": round(end.rss_mb, 1) if end else None},
        "latency_s": {"first_100_mean": _mean([s.latency_s for s in first]),
                      "last_100_mean": _mean([s.latency_s for s in last])},
        "largest_request": {**model.largest, "budget": budget},
        "log_bytes_per_turn": round((end.log_bytes - warm.log_bytes) / max(1, end.n - warm.n)) if end and warm else None,
        "fds": {"warm": warm.fds if warm else None, "end": end.fds if end else None},
        "thread_names": sorted(t.name for t in threading.enumerate()),  # at the end
        "threads": {"warm": warm.threads if warm else None, "end": end.threads if end else None,
                    "os_warm": warm.os_threads if warm else None, "os_end": end.os_threads if end else None},
        "load_avg": os.getloadavg(),
    }
    lat = result["latency_s"]
    # each hundred's mean: a trend shows here; one hundred's jitter (20 ms blocks, compute) shows as one point
    lat["means_by_100"] = [round(_mean([s.latency_s for s in answered[i:i + 100]]), 3)
                           for i in range(0, len(answered), 100)]
    if lat["first_100_mean"] and lat["last_100_mean"]:
        lat["ratio"] = round(lat["last_100_mean"] / lat["first_100_mean"], 3)
        lat["first_100_mean"], lat["last_100_mean"] = round(lat["first_100_mean"], 3), round(lat["last_100_mean"], 3)
    result["rss_mb"]["growth"] = round(end.rss_mb - warm.rss_mb, 1) if end and warm else None
    level = _levels(samples, warm)
    result["rss_mb"]["median_warm"], result["rss_mb"]["median_end"] = level["rss_mb"]
    result["rss_mb"]["median_growth"] = _growth(level["rss_mb"])
    if end and warm:  # where RSS growth went: memory in use, or freed memory the allocator kept
        result["heap_mb"] = {"used_growth": round(end.heap_used_mb - warm.heap_used_mb, 1),
                             "free_growth": round(end.heap_free_mb - warm.heap_free_mb, 1),
                             "median_used_growth": _growth(level["heap_used_mb"]),
                             "median_free_growth": _growth(level["heap_free_mb"])}
        result["python_blocks"] = {"warm": warm.py_blocks, "end": end.py_blocks,
                                   "per_turn": round((end.py_blocks - warm.py_blocks) / max(1, end.n - warm.n), 1)}
    result["checks"] = {
        "rss_growth_le_10mb": result["rss_mb"]["median_growth"] is not None and result["rss_mb"]["median_growth"] <= 10,
        "latency_ratio_le_1.05": lat.get("ratio") is not None and lat["ratio"] <= 1.05,
        "requests_within_budget": model.largest["tokens"] <= budget,
        "fds_unchanged": result["fds"]["warm"] == result["fds"]["end"],
        "threads_unchanged": result["threads"]["os_warm"] == result["threads"]["os_end"],
        "under_15_minutes": wall <= 900,
    }
    result["curve"] = [{"n": s.n, "rss_mb": round(s.rss_mb, 1), "heap_used_mb": round(s.heap_used_mb, 1),
                        "py_blocks": s.py_blocks,
                        "heap_free_mb": round(s.heap_free_mb, 1), "latency_s": s.latency_s and round(s.latency_s, 3),
                        "wall_s": round(s.wall_s, 1)} for s in samples if s.n % 50 == 0]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=None, help="where the log goes (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results-soak.json")
    parser.add_argument("--no-targets", action="store_true", help="report only (a smoke run is too short for them)")
    parser.add_argument("--max-wall-s", type=float, default=None,
                        help="end the session after this long (real seconds) and report the turns reached")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="voice-soak-") as tmp:
        result = run(args.turns, args.out or Path(tmp), args.max_wall_s)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json and not args.no_targets:
        args.json.write_text(text + "\n")
    failed = [k for k, ok in result["checks"].items() if not ok]
    if failed and not args.no_targets:
        print(f"soak: targets missed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
