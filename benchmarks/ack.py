"""Barge-in acknowledgement (speech onset -> reply silent) on the replay:
synthetic voices (stop.wav / wait.wav, the suite's cut points) and real
human voices (the `barge_in` clips of tests/fixtures/audio/human, held-out
and tune splits), each cut over a reply at several points.

    python benchmarks/ack.py [--cuts N] [--base DIR] [--json OUT]
    python benchmarks/ack.py --frames     # in process: the pause's floor and false pauses

`--base DIR` runs the same scenarios on another checkout too (e.g. the tree
before a change, extracted with `git archive REV | tar -x -C DIR`), one
scenario after the other, so both sets see the same machine load.

`--frames`: no replay, the listener's analyzer in process on 20 ms blocks,
8 alignments per clip: onset (first loud sample) -> the pause from the first
frames (voice.speech.onset) and -> the VAD's SPEAKING (the pause before),
on the same clips; and how many of the non-speech clips of
benchmarks/vad_grid.py (noise, fan, coughs, knocks, hum at three levels)
would pause a reply each way.
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


def frames_section(alignments: int = 8) -> dict:
    import numpy as np
    from pipecat.audio.vad.vad_analyzer import VADParams, VADState

    from common import RATE, first_loud, read_wav
    from vad_grid import BLOCK, _offsets, noise_clips
    from voice.speech.onset import FrameScoringSilero, OnsetDetector

    def listen(signal: np.ndarray) -> tuple[int | None, int | None]:
        analyzer = FrameScoringSilero(sample_rate=RATE, params=VADParams(confidence=0.7, start_secs=0.05,
                                                                        stop_secs=0.6, min_volume=0.4))
        analyzer.set_sample_rate(RATE)
        detector, onset, speaking = OnsetDetector(), None, None
        for end in range(BLOCK, len(signal) + 1, BLOCK):
            state = analyzer._run_analyzer(signal[end - BLOCK:end].tobytes())
            found = detector.feed(analyzer.take_frames(), end)
            if onset is None and found is not None:
                onset = end  # the block on which the pause is asked for
            if speaking is None and state == VADState.SPEAKING:
                speaking = end
        analyzer._executor.shutdown(wait=True)
        return onset, speaking

    files = json.loads((AUDIO / "human" / "index.json").read_text())["files"]
    speech = ["stop.wav", "wait.wav"] + [f"human/{f['file']}" for f in files if f["barge_in"]]
    lead = np.zeros(RATE, np.int16)
    out: dict = {"speech": {}, "false": {"first_frames": {}, "speaking": {}, "either": {}}}
    for name in speech:
        clip = read_wav(AUDIO / name)
        rows = []
        for off in _offsets(alignments):
            sig = np.concatenate([lead, np.zeros(off, np.int16), clip, np.zeros(RATE // 2, np.int16)])
            at = first_loud(sig)
            onset, speaking = listen(sig)
            rows.append(((onset - at) / RATE * 1000 if onset else None, (speaking - at) / RATE * 1000 if speaking else None))
        either = [min(x for x in r if x is not None) if any(x is not None for x in r) else None for r in rows]
        out["speech"][name] = {"first_frames_ms": stats([r[0] for r in rows]), "speaking_ms": stats([r[1] for r in rows]),
                               "pause_ms": stats(either)}  # both pause: whichever comes first
    sounds = noise_clips() | {n: read_wav(AUDIO / n) for n in ("cough.wav", "mm_hmm.wav")}
    for name, sig in sounds.items():
        for off in _offsets(2):
            onset, speaking = listen(np.concatenate([lead, np.zeros(off, np.int16), sig, np.zeros(RATE // 2, np.int16)]))
            for key, hit in (("first_frames", onset), ("speaking", speaking), ("either", onset or speaking)):
                if hit is not None:
                    out["false"][key][name] = out["false"][key].get(name, 0) + 1
    out["false_trials"] = 2 * len(sounds)
    return out


def print_frames(out: dict) -> None:
    print("| clip | first frames p50 / max ms | SPEAKING (before) p50 / max ms | pause now p50 / max ms |")
    print("|---|---|---|---|")
    for name, r in out["speech"].items():
        a, b, c = r["first_frames_ms"], r["speaking_ms"], r["pause_ms"]
        print(f"| {name} | {a['p50']:.0f} / {a['max']:.0f} | {b['p50']:.0f} / {b['max']:.0f} | "
              f"{c['p50']:.0f} / {c['max']:.0f} |")
    for key in ("first_frames", "speaking", "either"):
        hits = out["false"][key]
        print(f"{key}: pauses on {sum(hits.values())} of {out['false_trials']} non-speech trials {hits}")


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
    p.add_argument("--frames", action="store_true", help="only the in-process onset floor and false pauses")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args()
    if args.frames:
        out = frames_section()
        print_frames(out)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        return 0
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
