"""Laptop-speaker figures (issue #7): self-interruptions with echo
cancellation on and off, false cancels and false resumes, and the
barge-in acknowledgement through an echo path.

    python benchmarks/echo.py [--runs N] [--timing measured|recorded] [--json OUT]

Each scenario in tests/fixtures/scenarios/ is replayed N times through
`voice replay` (the same pipeline as `voice run`), and the log is counted.
The tests replay them on recorded timing (inference takes no time on the
clock: one outcome on any machine); here they run on measured timing by
default, so that when the reply starts moves with this machine's speed as
it would live, and N runs sample that:
- self_interruptions: turns cut although the person never spoke (echo only);
- false_cancels: backchannel/cough turns cut (they should pause and resume);
- false_resumes: real barge-ins that resumed instead of cutting;
- pauses: output paused by speech onset (each resumed or confirmed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "tests" / "fixtures" / "scenarios"
ECHO_ONLY = ["echo_only_1", "echo_only_2", "echo_only_3"]


def replay(name: str, out: Path, timing: str) -> dict:
    source = (SCENARIOS / f"{name}.toml").read_text().replace("../audio/", f"{SCENARIOS.parent / 'audio'}/")
    lines = [line for line in source.splitlines() if not line.startswith("timing =")]
    scenario = out.parent / f"{out.name}.toml"
    scenario.write_text(f'timing = "{timing}"\n' + "\n".join(lines) + "\n")
    subprocess.run([sys.executable, "-m", "voice", "replay", str(scenario), "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)
    sys.path.insert(0, str(ROOT))
    from voice.log.store import EventStore

    store = EventStore(out / "events.db")
    try:
        events = store.events()
    finally:
        store.close()
    summary = json.loads((out / "summary.json").read_text())
    return {"turns": summary["turns"], "types": [e.type for e in events]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--timing", choices=("measured", "recorded"), default="measured")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    counts = {"self_interruptions_aec_on": 0, "self_interruptions_aec_off": 0, "echo_only_runs": 0,
              "pauses_echo_only": 0, "false_cancels": 0, "false_resumes": 0, "backchannel_pauses": 0}
    acks: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            for name in ECHO_ONLY:
                r = replay(name, Path(tmp) / f"{name}-{run}", args.timing)
                counts["echo_only_runs"] += 1
                counts["self_interruptions_aec_on"] += sum(t["status"] == "aborted" for t in r["turns"])
                counts["pauses_echo_only"] += r["types"].count("speech/paused")
            r = replay("echo_no_aec", Path(tmp) / f"noaec-{run}", args.timing)
            counts["self_interruptions_aec_off"] += sum(t["status"] == "aborted" for t in r["turns"])
            r = replay("backchannel", Path(tmp) / f"bc-{run}", args.timing)
            counts["false_cancels"] += sum(t["status"] == "aborted" for t in r["turns"])
            counts["backchannel_pauses"] += r["types"].count("speech/paused")
            r = replay("echo_barge_in", Path(tmp) / f"bi-{run}", args.timing)
            cut = r["turns"][0]
            counts["false_resumes"] += cut["status"] != "aborted"
            if cut["ack_ms"] is not None:
                acks.append(cut["ack_ms"])
    result = {**counts, "ack_ms_with_aec_p50": statistics.median(acks) if acks else None,
              "ack_ms_with_aec_max": max(acks) if acks else None, "runs": args.runs, "timing": args.timing}
    for key, value in result.items():
        print(f"{key:32} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
