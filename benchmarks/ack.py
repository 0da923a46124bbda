"""Barge-in acknowledgement (speech onset -> reply silent) on the replay:
synthetic voices (stop.wav / wait.wav, the suite's cut points) and real
human voices (the `barge_in` clips of tests/fixtures/audio/human, held-out
and tune splits), each cut over a reply at several points.

    python benchmarks/ack.py [--cuts N] [--base DIR] [--json OUT]

`--base DIR` runs the same scenarios on another checkout too (e.g. the tree
before a change, extracted with `git archive REV | tar -x -C DIR`), one
scenario after the other, so both sets see the same machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ["HF_HUB_OFFLINE"] = "1"

import common  # noqa: E402
from common import AUDIO, stats  # noqa: E402
from replays import Cut, cut_points, run_cuts  # noqa: E402


def human_cuts(n_points: int) -> list[Cut]:
    files = json.loads((AUDIO / "human" / "index.json").read_text())["files"]
    clips = [f"human/{f['file']}" for f in files if f["barge_in"]]
    points = [0.8 + i * 4.0 / max(1, n_points - 1) for i in range(n_points)] if n_points > 1 else [2.5]
    return [Cut(f"human-{Path(c).stem}-{i}", "fast", round(x, 2), c) for c in clips for i, x in enumerate(points)]


def run(cuts: list[Cut], work: Path, root: Path | None) -> list[dict]:
    if root is not None:  # the other checkout's `voice` (python -m voice imports from the working directory)
        common.ROOT = root
    try:
        return run_cuts(cuts, work, score=False, log=lambda *a: print(*a, file=sys.stderr, flush=True))
    finally:
        common.ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cuts", type=int, default=6, help="synthetic cut points (half stop.wav, half wait.wav)")
    p.add_argument("--human-points", type=int, default=2, help="cut points per human clip")
    p.add_argument("--base", metavar="DIR", help="also measure this checkout, interleaved")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="voice-ack-"))
    sets = {"synthetic": cut_points(args.cuts, "tiny.en"),
            "human": [Cut(c.name, c.kind, c.barge_in_after, c.barge_clip, "tiny.en") for c in human_cuts(args.human_points)]}
    trees = {"this": None} | ({"base": Path(args.base)} if args.base else {})
    result: dict = {"load_before": os.getloadavg(), "machine": common.machine()}
    for name, cuts in sets.items():
        for cut in cuts:
            for tree, root in trees.items():
                r = run([cut], work / tree / name, root)[0]
                result.setdefault(tree, {}).setdefault(name, []).append(
                    {"clip": cut.barge_clip, "at": cut.barge_in_after, "ack_ms": r["ack_ms"],
                     "interrupted": r["interrupted"]})
    result["load_after"] = os.getloadavg()
    lines = []
    for tree in trees:
        for name in sets:
            rows = result[tree][name]
            s = stats([r["ack_ms"] for r in rows if r["ack_ms"] is not None])
            missed = sum(not r["interrupted"] for r in rows)
            result[tree][f"{name}_stats"] = s | {"missed": missed}
            lines.append(f"{tree:5} {name:9} ack p50 {s['p50']} p95 {s['p95']} max {s['max']} n {s['n']} missed {missed}")
    print("\n".join(lines))
    print(f"load average before {result['load_before']}, after {result['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
