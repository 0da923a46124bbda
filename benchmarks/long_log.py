"""Does the assistant start and answer as fast on a log that holds thousands
of turns as on an empty one (issue #14)? Everything `voice run` does with the
log, measured on an empty log and on one with --turns turns (spread over
conversations that ended, the latest one long):

- start: open the log (schema check, quick_check, migrations), start-up
  recovery, the timers read once, the conversation chosen (open_app +
  resume_or_new);
- answer: one typed turn through the agent loop with the built-in skills
  provider (start_turn, the context window, the request, tools, the log
  writes), the median of --answers turns.

    python benchmarks/long_log.py [--turns 5000] [--answers 20]

The speech models and audio are left out: they do not touch the log, and
their cost is the same on any log (benchmarks/soak.py measures them).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def fill(db: Path, turns: int, per_conversation: int = 200) -> None:
    """A log as a month of talk leaves it: each turn a request, a reply the
    person heard, its stream, steps and end; a conversation end every
    `per_conversation` turns except in the latest, which holds the rest."""
    from voice.log import events as ev
    from voice.log.store import EventStore

    store = EventStore(db)
    try:
        conversation = "c-0"
        for n in range(turns):
            if n and n % per_conversation == 0 and n < turns - per_conversation:
                store.record(conversation, ev.ConversationEnd(reason="idle", idle_s=1000.0))
                conversation = f"c-{n}"
            turn = store.start_turn(conversation, ev.TurnStart(source="voice"))
            store.record(conversation, ev.UserMessage(content=f"what is fact number {n} about the moon"), turn=turn)
            store.record(conversation, ev.StepStart(route={"provider": "skills", "model": "builtin"}), turn=turn, step=0,
                         attempt=0)
            text = f"Fact {n}: the moon always shows the same face to the earth."
            store.record(conversation, ev.AssistantMessage(message_id=f"m_{turn}", content=[{"type": "text", "text": text}],
                                                           stream=[[i * 40, "text", w] for i, w in enumerate(text.split())]),
                         turn=turn, step=0, attempt=0)
            store.record(conversation, ev.SpeechPlayed(message_id=f"m_{turn}", chars=len(text), words=11,
                                                       samples=48000, complete=True), turn=turn, step=0, attempt=0)
            store.record(conversation, ev.StepEnd(outcome="completed"), turn=turn, step=0, attempt=0)
            store.end_turn(conversation, turn, ev.COMPLETED)
    finally:
        store.close()


async def measure(db: Path, answers: int) -> dict:
    from voice.app import open_app
    from voice.settings import Settings
    from voice.config import defaults_path, load_config_with_sources
    from voice.log.conversations import resume_or_new
    from voice.surfaces.text import TextSurface

    from voice.agent.providers.skills import SkillsProvider

    config = load_config_with_sources(defaults_path(), env={})[0]
    began = time.perf_counter()
    # The built-in skills with no pacing: what is left of an answer is the work around the model.
    async with open_app(Settings.from_config(config), db=db, llm=SkillsProvider(chunk_delay_s=0), data_dir=db.parent / "data") as app:
        conversation = resume_or_new(app.store, config["conversation"]["idle_gap_s"], now=time.time())
        app.timers.active()
        started = time.perf_counter() - began
        agent = app.agent(TextSurface(out=io.StringIO()), conversation)
        times = []
        for n in range(answers):
            t = time.perf_counter()
            await agent.run_turn("what time is it")
            times.append(time.perf_counter() - t)
    return {"start_s": round(started, 4), "answer_ms_median": round(statistics.median(times) * 1000, 2),
            "answer_ms_max": round(max(times) * 1000, 2)}


def main() -> int:
    import anyio

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=5000)
    parser.add_argument("--answers", type=int, default=20)
    parser.add_argument("--fill-only", type=Path, metavar="DIR",
                        help="only write the long log into DIR (untimed; then time it with --log DIR)")
    parser.add_argument("--log", type=Path, metavar="DIR", help="a long log written before with --fill-only")
    args = parser.parse_args()
    if args.fill_only:
        args.fill_only.mkdir(parents=True, exist_ok=True)
        fill(args.fill_only / "events.db", args.turns)
        return 0
    with tempfile.TemporaryDirectory(prefix="voice-long-log-") as tmp:
        empty, full = Path(tmp) / "empty" / "events.db", Path(tmp) / "full" / "events.db"
        empty.parent.mkdir()
        full.parent.mkdir()
        t = time.perf_counter()
        if args.log:
            import shutil

            shutil.copy(args.log / "events.db", full)
        else:
            fill(full, args.turns)
        filled_s = time.perf_counter() - t
        # Interleaved, twice each, so a burst of load elsewhere hits both alike.
        runs = {"empty": [], "full": []}
        for _ in range(2):
            for name, db in (("empty", empty), ("full", full)):
                runs[name].append(anyio.run(measure, db, args.answers))
        result = {name: min(r, key=lambda x: x["answer_ms_median"]) for name, r in runs.items()}
        result.update(turns=args.turns, log_mb=round(full.stat().st_size / 1e6, 1), fill_s=round(filled_s, 1),
                      load_avg=os.getloadavg())
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
