"""The benchmark suite of `voice`.

    python benchmarks/run.py [--quick | --smoke] [--json OUT] [--no-peer]
    python benchmarks/run.py --table [--write]

Measures (median, p95, count): ack_ms, termination_ms (blocked I/O and a
SIGTERM-resistant child), prefix_error_words, v2v_ms (tiny.en and base, with
a breakdown), replay_speedup, idle_cpu_pct, peak_rss_mb; the VAD grid that
bounds ack_ms; and the peer (a stock pipecat 1.14 pipeline) on the same
barge-in scenarios. See benchmarks/RESULTS.md.

`--table` measures nothing: it prints the current figures, one row per
measure, from the latest recorded result files (benchmarks/current.py);
`--write` also puts them at the top of RESULTS.md and in README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ["HF_HUB_OFFLINE"] = "1"

import common  # noqa: E402
from common import stats  # noqa: E402

MODES = {
    #          ack cuts, tiny cuts, term reps, resistant reps, idle tail, vad alignments, vad replay configs, peer cuts
    "smoke": dict(cuts=1, tiny=0, term=3, resistant=1, tail=3.0, align=2, vad_replays=0, peer=1),
    "quick": dict(cuts=6, tiny=2, term=10, resistant=2, tail=12.0, align=8, vad_replays=2, peer=4),
    "full": dict(cuts=20, tiny=6, term=30, resistant=5, tail=25.0, align=16, vad_replays=12, peer=10),
}

REQUIRED_KEYS = ("ack_ms_p50", "ack_ms_p95", "termination_ms_p95", "termination_resistant_ms_p95",
                 "prefix_error_words_mean", "peer_prefix_error_words_mean", "peer_ack_ms_p50", "v2v_ms_p50",
                 "replay_speedup", "idle_cpu_pct", "peak_rss_mb")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def vad_section(mode: dict, work: Path) -> dict:
    import vad_grid
    from replays import Cut, run_cuts

    t = time.perf_counter()
    rows = vad_grid.run_grid(alignments=mode["align"])
    cost = vad_grid.cpu_cost()
    log(f"vad grid: {time.perf_counter() - t:.1f} s")
    replay_ack: dict = {}
    if mode["vad_replays"]:
        default = (0.1, 0.6, 0.7)
        order = [default, (0.05, 0.2, 0.7), (0.05, 0.4, 0.7), (0.1, 0.2, 0.5)]
        order += [g for g in vad_grid.GRID if g not in order]
        for start_secs, min_volume, confidence in order[:mode["vad_replays"]]:
            tag = f"s{start_secs}-v{min_volume}-c{confidence}"
            cfg = work / f"vad-{tag}.toml"
            cfg.write_text(f"[vad]\nstart_secs = {start_secs}\nmin_volume = {min_volume}\nconfidence = {confidence}\n")
            cuts = [Cut(f"vad-{tag}-{clip[:4]}", "fast", x, clip) for clip, x in (("stop.wav", 2.3), ("wait.wav", 3.7))]
            res = run_cuts(cuts, work / "vad", score=False, log=log, config=cfg)
            replay_ack[(start_secs, min_volume, confidence)] = stats([r["ack_ms"] for r in res if r["ack_ms"]])
    for r in rows:
        r["replay_ack_ms"] = replay_ack.get((r["start_secs"], r["min_volume"], r["confidence"]))
    return {"rows": rows, "table": vad_grid.format_rows(rows, replay_ack), "vad_cpu": cost}


def v2v_step(name: str, mode: dict, work: Path) -> dict:
    """benchmarks/v2v.py into work/v2v, a folder no one has made yet."""
    import v2v

    if name == "smoke":  # one clip, tiny.en, the scripted model, no peer: the step's code path, in seconds
        return v2v.measure(work / "v2v", quick=True, peer_runs=0, log=log, stt_models=("tiny.en",),
                           clips=["what_time.wav"])
    # minutes of replays; benchmarks/v2v.py runs it alone
    return v2v.measure(work / "v2v", quick=name == "quick", peer_runs=mode["peer"], log=log)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="fewer cut points (< 10 min on 2 cores)")
    g.add_argument("--smoke", action="store_true", help="one scenario of each kind (CI: keeps the code path alive)")
    p.add_argument("--json", metavar="OUT", help="write the results object here")
    p.add_argument("--no-peer", action="store_true", help="skip the stock pipecat peer")
    p.add_argument("--keep", metavar="DIR", help="keep replay outputs under DIR (default: a temp dir)")
    g.add_argument("--table", action="store_true",
                   help="measure nothing: print the current figures from the recorded result files")
    p.add_argument("--write", action="store_true", help="with --table: write them into RESULTS.md and README.md")
    args = p.parse_args(argv)
    if args.write and not args.table:
        p.error("--write goes with --table (it writes the table of recorded figures)")
    if args.table:
        import current

        print(current.results_table())
        for path in current.write() if args.write else []:
            log(f"wrote {path}")
        return 0
    name = "smoke" if args.smoke else "quick" if args.quick else "full"
    mode = MODES[name]
    started = time.perf_counter()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="voice-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"mode {name}; outputs under {work}")

    from replays import cut_points, run_cuts, summarize
    import termination
    import idle

    result: dict = {"mode": name, "machine": common.machine(), "versions": common.versions()}

    # -- barge-in replays (base), then tiny.en for v2v --------------------
    log("barge-in replays (stt base):")
    base = run_cuts(cut_points(mode["cuts"], "base"), work / "cuts", log=log)
    tiny = []
    if mode["tiny"]:
        log("barge-in replays (stt tiny.en):")
        tiny = run_cuts(cut_points(mode["tiny"], "tiny.en", lo=1.0), work / "cuts", log=log)
    sb, st = summarize(base), summarize(tiny) if tiny else None
    both = summarize(base + tiny)
    result["replay"] = {"base": sb, "tiny.en": st, "cuts": base + tiny}

    # -- termination --------------------------------------------------------
    log("termination:")
    term = termination.measure(mode["term"], mode["resistant"])
    result["termination"] = term
    log(f"  blocked p95 {term['termination_ms']['p95']:.1f} ms, resistant p95 {term['termination_resistant_ms']['p95']:.1f} ms")

    # -- idle -----------------------------------------------------------------
    log(f"idle (realtime, {mode['tail']} s silent tail):")
    idl = idle.measure(work / "idle", tail=mode["tail"], stt_model="tiny.en" if name == "smoke" else None)
    result["idle"] = idl
    log(f"  {idl}")

    # -- VAD grid ---------------------------------------------------------------
    log("vad grid:")
    vad = vad_section(mode, work)
    result["vad_grid"] = {"rows": vad["rows"], "vad_cpu": vad["vad_cpu"]}

    # -- peer ---------------------------------------------------------------------
    peer = None
    if not args.no_peer:
        log("peer (stock pipecat pipeline, real-time paced):")
        try:
            import peer as peer_mod

            from replays import Cut

            peer_cuts = ([Cut("smoke-peer", "fast", 0.8, "stop.wav")] if name == "smoke"
                         else cut_points(mode["peer"], "base"))
            peer = peer_mod.run_peer(peer_cuts, work / "peer", log=log)
        except Exception as exc:  # report, don't hide: the table says why
            import traceback

            traceback.print_exc()
            peer = {"error": f"{type(exc).__name__}: {exc}"}
        result["peer"] = peer

    # -- voice to voice: end of turn, speculation, TTFT 0/300, the peer beside --
    log("voice to voice (benchmarks/v2v.py):")
    v2v = result["v2v"] = v2v_step(name, mode, work)

    # -- flat keys -------------------------------------------------------------
    v2v_tiny = (st or {}).get("v2v_ms", {})
    flat = {
        "ack_ms_p50": both["ack_ms"]["p50"], "ack_ms_p95": both["ack_ms"]["p95"], "ack_ms_n": both["ack_ms"]["n"],
        "termination_ms_p50": term["termination_ms"]["p50"], "termination_ms_p95": term["termination_ms"]["p95"],
        "termination_ms_n": term["termination_ms"]["n"],
        "termination_resistant_ms_p50": term["termination_resistant_ms"]["p50"],
        "termination_resistant_ms_p95": term["termination_resistant_ms"]["p95"],
        "termination_resistant_ms_n": term["termination_resistant_ms"]["n"],
        "prefix_error_words_mean": both["prefix_error_words"]["mean"],
        "prefix_error_words_p95": both["prefix_error_words"]["p95"],
        "prefix_error_words_n": both["prefix_error_words"]["n"],
        "prefix_signed_words_mean": both["prefix_signed_words"]["mean"],
        "prefix_count_error_words_mean": both["prefix_count_error_words"]["mean"],
        # v2v headline: tiny.en (the target's model); base alongside
        "v2v_ms_p50": v2v_tiny.get("p50") if v2v_tiny.get("n") else sb["v2v_ms"]["p50"],
        "v2v_ms_p95": v2v_tiny.get("p95") if v2v_tiny.get("n") else sb["v2v_ms"]["p95"],
        "v2v_ms_n": v2v_tiny.get("n") if v2v_tiny.get("n") else sb["v2v_ms"]["n"],
        "v2v_stt_model": "tiny.en" if v2v_tiny.get("n") else "base",
        "v2v_ms_base_p50": sb["v2v_ms"]["p50"], "v2v_ms_base_p95": sb["v2v_ms"]["p95"],
        "replay_speedup": both["replay_speedup"]["p50"],
        "replay_speedup_min": both["replay_speedup"]["min"],
        "idle_cpu_pct": idl["idle_cpu_pct"], "peak_rss_mb": idl["peak_rss_mb"],
        "peer_prefix_error_words_mean": None, "peer_ack_ms_p50": None, "peer_ack_ms_p95": None,
    }
    for model, s in (("tiny", st), ("base", sb)):
        if s:
            for k, v in s["v2v_breakdown_p50"].items():
                flat[f"v2v_{model}_{k}_p50"] = v
    for row in (v2v or {}).get("rows", []):
        key = f"v2v_{row['stt'].replace('.', '_')}_ttft{row['ttft_ms']}_{'early' if row['early'] else 'vad'}"
        flat[f"{key}_p50"], flat[f"{key}_p95"] = row["v2v_ms"]["p50"], row["v2v_ms"]["p95"]
        flat[f"{key}_false_splits"] = row["false_splits"]
        flat[f"{key}_eot_p50"] = row["parts_p50"]["eot_ms"]
    if v2v["peer_v2v_ms"]:
        flat["peer_v2v_ms_p50"] = v2v["peer_v2v_ms"]["p50"]
    if peer and "error" not in peer:
        flat["peer_prefix_error_words_mean"] = peer["prefix_error_words"]["mean"]
        flat["peer_ack_ms_p50"] = peer["ack_ms"]["p50"]
        flat["peer_ack_ms_p95"] = peer["ack_ms"]["p95"]
        flat["peer_prefix_error_words_n"] = peer["prefix_error_words"]["n"]
    result.update(flat)
    result["elapsed_s"] = time.perf_counter() - started

    table = render(result, vad["table"])
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")
        log(f"wrote {args.json}")
    log(f"done in {result['elapsed_s']:.0f} s")
    return 0


def _f(v, unit=""):
    if v is None:
        return "n/a"
    return f"{v:.1f}{unit}" if isinstance(v, float) else f"{v}{unit}"


def render(r: dict, vad_table: str) -> str:
    rb, rt = r["replay"]["base"], r["replay"]["tiny.en"]
    term = r["termination"]
    peer = r.get("peer")

    def row(name, s, target="", note=""):
        return f"| {name} | {_f(s.get('p50'))} | {_f(s.get('p95'))} | {_f(s.get('mean'))} | {s.get('n', 0)} | {target} | {note} |"

    lines = [f"voice benchmarks ({r['mode']}) on {r['machine']['cores']} cores, {r['machine']['cpu_model']}; "
             + ", ".join(f"{k} {v}" for k, v in r["versions"].items()), "",
             "| metric | p50 | p95 | mean | n | target | note |", "|---|---|---|---|---|---|---|"]
    both = {"p50": r["ack_ms_p50"], "p95": r["ack_ms_p95"], "n": r["ack_ms_n"],
            "mean": stats([c["ack_ms"] for c in r["replay"]["cuts"] if c["ack_ms"] is not None])["mean"]}
    lines.append(row("ack_ms (all cuts)", both, "p50 ≤ 120, p95 ≤ 200"))
    lines.append(row("ack_ms, cut after stream completed", rb["ack_ms_fast_stream"]))
    lines.append(row("ack_ms, cut during stream", rb["ack_ms_slow_stream"]))
    lines.append(row("termination_ms (blocked I/O: all)", term["termination_ms"], "p95 ≤ 250"))
    lines.append(row("  run_process direct", term["termination_direct_ms"]))
    lines.append(row("  AgentLoop turn, mid-tool", term["termination_agent_turn_ms"]))
    lines.append(row("  socket read", term["termination_socket_ms"]))
    lines.append(row("termination_resistant_ms (kill_after_s 2.0)", term["termination_resistant_ms"], "p95 ≤ 2500"))
    pe = {"p50": None, "p95": r["prefix_error_words_p95"], "mean": r["prefix_error_words_mean"], "n": r["prefix_error_words_n"]}
    lines.append(row("prefix_error_words", pe, "mean ≤ 1", f"signed mean (heard − delivered) {_f(r['prefix_signed_words_mean'])}; word-count error mean {_f(r.get('prefix_count_error_words_mean'))}"))
    if rt:
        lines.append(row("v2v_ms (tiny.en)", rt["v2v_ms"], "p50 ≤ 1000", _breakdown(rt)))
    lines.append(row("v2v_ms (base)", rb["v2v_ms"], "", _breakdown(rb)))
    lines.append(row("replay_speedup", rb["replay_speedup"] if not rt else {**stats([c["speedup"] for c in r["replay"]["cuts"]])}, "≥ 5"))
    idl = r["idle"]
    lines.append(f"| idle_cpu_pct | {_f(idl['idle_cpu_pct'])} | | | 1 | ≤ 5 | {idl['idle_window_s']:.0f} s window of silence, real time; whole process incl. model load {_f(idl['whole_process_cpu_pct'])} % |")
    lines.append(f"| peak_rss_mb | {_f(idl['peak_rss_mb'])} | | | 1 | | ru_maxrss of `voice replay --realtime` (stt base) |")
    vc = r["vad_grid"]["vad_cpu"]
    lines.append(f"| Silero+volume CPU per s of audio | {_f(vc['cpu_pct_of_realtime'])} % | | | 1 | | in-process, one core |")
    for v in (r.get("v2v") or {}).get("rows", []):
        sp = v["speculations"]
        lines.append(row(f"v2v_ms ({v['stt']}, TTFT {v['ttft_ms']} ms, {'early end' if v['early'] else 'VAD end'})",
                         v["v2v_ms"], "", "p50 parts: " + " + ".join(f"{k[:-3]} {_f(x)}" for k, x in v["parts_p50"].items())
                         + f"; false splits {v['false_splits']}; speculations {sp.get('speculations')}, used {sp.get('used')}"
                         + f"; early model starts {sp.get('early_starts')}, used {sp.get('early_used')}"))
    if (r.get("v2v") or {}).get("peer_v2v_ms"):
        lines.append(row("PEER v2v_ms (stock pipecat, smart-turn v3, base)", r["v2v"]["peer_v2v_ms"], "",
                         "three_points.wav; ours on the same clip and reply: "
                         + ", ".join(f"{'early' if o['early'] else 'VAD'} {_f(o['v2v_ms']['p50'])}"
                                     for o in r["v2v"]["ours_on_peer_clip"])))
    if peer is not None:
        if "error" in peer:
            lines.append(f"| PEER | failed | | | | | {peer['error']} |")
        else:
            lines.append(row("PEER ack_ms (stock pipecat)", peer["ack_ms"], "", peer.get("note", "")))
            lines.append(row("PEER prefix_error_words (committed vs heard)", peer["prefix_error_words"], "",
                             f"committed − heard words, signed mean {_f(peer['prefix_signed_words']['mean'])}"))
            lines.append(row("PEER ours-style delivered (word-timed) error", peer.get("spoken_prefix_error_words", {}), "", "what a word-timed record would give on the peer's audio"))
    lines += ["", "VAD grid (ack floor = onset → Silero SPEAKING; false triggers on non-speech):", "", vad_table]
    return "\n".join(lines)


def _breakdown(s: dict) -> str:
    b = s["v2v_breakdown_p50"]
    return ("p50 parts: end-of-turn " + _f(b["eot_ms"]) + " + STT " + _f(b["stt_ms"]) + " + first sentence streamed "
            + _f(b["first_sentence_ms"]) + " (first token " + _f(b["first_token_ms"]) + ") + TTS/first block " + _f(b["first_audio_ms"]))


if __name__ == "__main__":
    sys.exit(main())
