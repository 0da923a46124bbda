"""Live figures, on virtual PipeWire devices (tests/live/audio_server.py):

    python benchmarks/live.py [--clicks 10] [--conversations 3] [--idle 20] [--v2v 5] [--json OUT]
    python benchmarks/live.py --v2v-only [--v2v 5] [--json OUT]

- output delay: the real LiveDevice stream plays a click every 0.5 s while
  `speaker.monitor` is recorded with every chunk stamped on the monotonic
  clock; the delay from the callback that handed a block to the device to
  that block's first sample on the monitor (median over the clicks), against
  what sounddevice reports (the stream's static `latency`, and PortAudio's
  per-callback DAC time). Meanwhile the playback cursor is read at random
  moments as VoiceSurface reads it (position - output_latency()) and
  compared with the sample actually reaching the monitor then: the cursor
  error with LiveDevice's correction and with the static figure.
- live acknowledgement: `voice run` with the scripted barge-in conversation
  (tests/live/conversation.py); the barge-in's onset in the mic feed to the
  last sample of the cut reply on `speaker.monitor`.
- idle CPU of `voice run` listening to silence on the virtual devices
  (with --idle-only: in wake and open mode, and the floor under both, bare
  input and output streams like LiveDevice's that only play silence, one after the
  other in each round, so all three compare within one run).
- voice-to-voice, live: `voice run` in wake mode ("Okay Nabu. What time is
  it?", each after the conversation window has closed) and in open mode
  ("What time is it?"), the scripted model answering at once with
  benchmarks/v2v.py's reply; from the request's last loud sample in the mic
  feed to the reply's first loud sample on `speaker.monitor`, split by the
  log into end of turn, recognition after it, and the rest (the model's
  first clause, its synthesis, the device's output).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ["HF_HUB_OFFLINE"] = "1"

from live.audio_server import AudioServer, ensure_packages  # noqa: E402
from live.conversation import AUDIO, Exchange, LiveDaemon, ask, converse, cpu_seconds, thread_cpu_seconds  # noqa: E402
from v2v import REPLY  # noqa: E402  (benchmarks/, this script's folder)

from voice.log import events as ev  # noqa: E402
from voice.settings import ListenSettings  # noqa: E402


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def pctl(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, float), q))


# -- output delay and the cursor ------------------------------------------------------------


def output_delay(server: AudioServer, clicks: int) -> dict:
    """In this process: the device must be opened with the server's
    environment, which PortAudio reads when sounddevice is first imported."""
    os.environ.update(server.env)
    import anyio

    from voice.audio.live import LiveDevice

    dev = LiveDevice()
    rate = dev.out_rate
    rec = server.record("speaker.monitor", rate=rate)
    pulls: list[tuple[float, int, int, float | None]] = []  # (called, position after, frames, PortAudio DAC delay)
    pull = dev.buffer.pull

    def stamped_pull(n: int):
        called = time.monotonic()
        out = pull(n)
        block = dev._last_block  # set by the same callback, just before the pull
        pulls.append((called, dev.buffer.position, n, block[1] if block else None))
        return out

    dev.buffer.pull = stamped_pull  # the callback's pull, timed
    cursor: list[tuple[float, int, int]] = []  # (time, position, output_latency()) as the surface reads them
    starts: list[int] = []

    async def main() -> None:
        async def on_mic(*blocks: bytes) -> None:
            pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(dev.run, on_mic)
            await anyio.sleep(1.0)
            for i in range(clicks):
                click = np.zeros(rate // 10, np.int16)
                click[:20] = 20000
                dev.buffer.enqueue(("click", i), click)
                until = time.monotonic() + 0.5
                while time.monotonic() < until:
                    cursor.append((time.monotonic(), dev.buffer.position, dev.output_latency()))
                    await anyio.sleep(random.uniform(0.001, 0.007))
                span = dev.buffer.span(("click", i))
                starts.append(span[0] if span else -1)
            await anyio.sleep(0.3)
            tg.cancel_scope.cancel()

    anyio.run(main)
    rec.stop()
    reported_s = dev._latency_s
    x = rec.samples()
    onsets = list(np.flatnonzero((np.abs(x[1:]) > 10000) & (np.abs(x[:-1]) <= 10000)) + 1)
    if len(onsets) != clicks:
        raise RuntimeError(f"{len(onsets)} clicks on the monitor, {clicks} played")
    delays, pa_delays, err_dyn, err_static = [], [], [], []
    for start, onset in zip(starts, onsets):
        appeared = rec.time_of(onset)
        called, after, n, pa = next(p for p in pulls if p[1] - p[2] <= start < p[1])
        first = appeared - (start - (after - n)) / rate  # when the block's first sample reached the monitor
        delays.append((first - called) * 1000)
        if pa is not None:
            pa_delays.append(pa * 1000)
        for t, position, latency in cursor:
            if abs(t - appeared) < 0.2:  # near this click, where the recording's clock is anchored
                truth = start + (t - appeared) * rate  # the sample reaching the monitor at t
                err_dyn.append((position - latency - truth) / rate * 1000)
                err_static.append((position - round(reported_s * rate) - truth) / rate * 1000)
    return {
        "rate": rate,
        "clicks": clicks,
        "measured_output_delay_ms_median": statistics.median(delays),
        "measured_output_delay_ms_range": [min(delays), max(delays)],
        "reported_latency_ms": reported_s * 1000,
        "portaudio_dac_delay_ms_median": statistics.median(pa_delays) if pa_delays else None,
        "portaudio_dac_delay_ms_range": [min(pa_delays), max(pa_delays)] if pa_delays else None,
        "cursor_error_ms": {
            name: {"mean": statistics.fmean(e), "abs_mean": statistics.fmean(abs(v) for v in e),
                   "abs_p95": pctl(np.abs(e), 95), "abs_max": float(np.max(np.abs(e))),
                   "over_5ms": int(np.sum(np.abs(e) > 5)), "n": len(e)}
            for name, e in (("livedevice", err_dyn), ("static_reported", err_static))
        },
    }


# -- the live acknowledgement ------------------------------------------------------------------


def live_ack(server: AudioServer, work: Path, n: int) -> dict:
    acks, after_stop = [], []
    for i in range(n):
        c = converse(server, work / f"conversation-{i}")
        if c.returncode != 0:
            raise RuntimeError(f"voice run exited {c.returncode}: {c.daemon.log()}")
        _, onset_t = c.barge_in_onset()
        _, end_t = c.reply_end(onset_t)
        events = c.daemon.events()
        first_turn = min(e.turn for e in events if e.turn is not None)
        stops = [e.at_mono for e in events if e.turn == first_turn and e.type in ("speech/paused", "turn/end")]
        acks.append((end_t - onset_t) * 1000)
        after_stop.append((end_t - min(stops)) * 1000)
        log(f"conversation {i}: ack {acks[-1]:.0f} ms, last reply sample {after_stop[-1]:+.0f} ms after the log's stop")
    return {"live_ack_ms": acks, "live_ack_ms_median": statistics.median(acks) if acks else float("nan"),
            "last_sample_after_logged_stop_ms": after_stop}


# -- idle CPU ---------------------------------------------------------------------------------------


def idle_cpu(server: AudioServer, work: Path, window: float, mode: str = "open") -> dict:
    """`voice run` in listen mode `mode` ("open", or "wake": nothing said, so
    only the wake word listens), CPU over `window` seconds of silence."""
    daemon = LiveDaemon(work / f"idle-{mode}", server, listen_mode=mode)
    try:
        daemon.wait_listening()
        time.sleep(3.0)  # past start-up
        load = os.getloadavg()[0]
        c0, t0, th0 = cpu_seconds(daemon.proc.pid), time.monotonic(), thread_cpu_seconds(daemon.proc.pid)
        time.sleep(window)
        c1, t1, th1 = cpu_seconds(daemon.proc.pid), time.monotonic(), thread_cpu_seconds(daemon.proc.pid)
    finally:
        daemon.stop()
    # Where it goes, per thread (Python does not name its threads for the OS): "main" is the event loop's.
    threads = {("main" if tid == daemon.proc.pid else f"thread-{tid}"): (seconds - th0.get(tid, 0.0)) / (t1 - t0) * 100
               for tid, seconds in th1.items()}
    return {"idle_cpu_pct": (c1 - c0) / (t1 - t0) * 100, "idle_window_s": t1 - t0, "load_avg_1min": load,
            "threads_pct": {k: round(v, 2) for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v >= 0.05}}


# The floor under idle CPU: the same two streams the daemon's LiveDevice opens (the default devices, int16, mono,
# their blocks at the virtual devices' 48 kHz) with callbacks that only take the mic and write silence, in a
# process of its own.
FLOOR_STREAM = """
import os, sys, time
import sounddevice as sd
def on_input(indata, frames, time_info, status):
    pass
def on_output(outdata, frames, time_info, status):
    outdata.fill(0)
block = 48000 * int(sys.argv[2]) // 1000
with sd.InputStream(samplerate=48000, blocksize=block, channels=1, dtype="int16", callback=on_input), \\
        sd.OutputStream(samplerate=48000, blocksize=block, channels=1, dtype="int16", callback=on_output):
    time.sleep(3.0)
    c0, t0 = os.times(), time.monotonic()
    time.sleep(float(sys.argv[1]))
    c1, t1 = os.times(), time.monotonic()
print((c1.user - c0.user + c1.system - c0.system) / (t1 - t0) * 100)
"""


def idle_floor(server: AudioServer, window: float) -> dict:
    """CPU of bare input and output streams like LiveDevice's that only play silence:
    what the audio stack (PortAudio's and PipeWire's threads) costs alone."""
    import subprocess

    from voice.service.daemon import DEVICE_BLOCK_MS

    load = os.getloadavg()[0]
    out = subprocess.run([sys.executable, "-c", FLOOR_STREAM, str(window), str(DEVICE_BLOCK_MS)], env=server.env,
                         capture_output=True, text=True, timeout=window + 60)
    if out.returncode != 0:
        raise RuntimeError(f"the bare streams failed: {out.stderr[-1000:]}")
    return {"idle_cpu_pct": float(out.stdout.split()[-1]), "idle_window_s": window, "load_avg_1min": load,
            "threads_pct": {}}


# -- voice-to-voice, live ------------------------------------------------------------------------

V2V_REQUEST = {"wake": AUDIO / "okay_nabu_what_time.wav", "open": AUDIO / "what_time.wav"}
# After each reply played out, silence before the next request: in wake mode
# past the conversation window, so every request wakes the assistant afresh.
V2V_PAUSE_S = {"wake": ListenSettings().window_s + 1.0, "open": 1.5}


def live_v2v(server: AudioServer, work: Path, n: int, mode: str) -> dict:
    """One `voice run` in listen mode `mode`, asked `n` times, one request
    after the other's reply. The reply is the replay benchmark's (v2v.py:
    40 ms a word, a 12-word first clause), so the figures compare with its."""
    tmp = work / f"v2v-{mode}"
    tmp.mkdir(parents=True, exist_ok=True)
    script = tmp / "replies.toml"
    script.write_text(f'[[reply]]\nfirst_delay_ms = 0\nchunk_delay_ms = 40\ntext = "{REPLY}"\n\n' * n)
    speaker, mic = server.record("speaker.monitor"), server.record("micfeed.monitor")
    daemon = LiveDaemon(tmp, server, script, listen_mode=mode)
    exchanges = []
    try:
        daemon.wait_listening()
        time.sleep(V2V_PAUSE_S[mode])  # past start-up, and (wake) as after a reply
        for i in range(n):
            exchanges.append(ask(server, daemon, speaker, mic, V2V_REQUEST[mode]))
            time.sleep(V2V_PAUSE_S[mode])
    finally:
        speaker.stop()
        mic.stop()
        code = daemon.stop()
        (tmp / "daemon.log").write_text(daemon.log())
    if code != 0:
        raise RuntimeError(f"voice run exited {code}: {daemon.log()}")
    rows = [{"v2v_ms": x.v2v_ms, **v2v_parts(daemon.events(), x)} for x in exchanges]
    for i, r in enumerate(rows):
        log(f"{mode:5} request {i}: v2v {r['v2v_ms']:.0f} ms = end of turn {_ms(r['eot_ms'])} + recognition "
            f"{_ms(r['stt_ms'])} + turn start -> first reply sample {_ms(r['reply_ms'])}")
    med = {k: _median([r[k] for r in rows]) for k in ("v2v_ms", "eot_ms", "stt_ms", "reply_ms")}
    return {"mode": mode, "request": V2V_REQUEST[mode].name, "n": n, "medians": med, "requests": rows,
            "load_avg_1min": os.getloadavg()[0]}


def v2v_parts(events: list[ev.Event], x: Exchange) -> dict:
    """The request's turn in the log, on the recordings' clock (`at_mono`):
    the end of turn decided (its listen/speech, logged when the block that
    ended it was heard: the mic's input delay included), then the turn's
    start (recognition done), then the reply's first sample."""
    start = next((e for e in events if e.type == ev.TURN_START and e.at_mono > x.played_at), None)
    if start is None:
        return {"eot_ms": None, "stt_ms": None, "reply_ms": None, "stt_logged_ms": None}
    ended = [e for e in events if e.type == ev.LISTEN_SPEECH and e.body.for_assistant
             and x.played_at < e.at_mono <= start.at_mono]
    message = next((e for e in events if e.type == ev.USER_MESSAGE and e.turn == start.turn), None)
    audio = message.body.audio if message is not None else None
    decided = ended[-1].at_mono if ended else None
    return {"eot_ms": None if decided is None else (decided - x.request_end) * 1000,
            "stt_ms": None if decided is None else (start.at_mono - decided) * 1000,
            "reply_ms": (x.reply_start - start.at_mono) * 1000,
            "stt_logged_ms": (audio or {}).get("stt_ms")}  # the daemon's own figure for recognition after the end


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ms(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


def print_v2v(runs: list[dict]) -> None:
    for r in runs:
        m = r["medians"]
        print(f"{r['mode']:5} v2v median {_ms(m['v2v_ms'])} ms over {r['n']} ({r['request']}): end of turn "
              f"{_ms(m['eot_ms'])} + recognition {_ms(m['stt_ms'])} + turn start -> first reply sample "
              f"{_ms(m['reply_ms'])}; all: {', '.join(_ms(q['v2v_ms']) for q in r['requests'])} "
              f"(load average {r['load_avg_1min']:.1f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clicks", type=int, default=10)
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--idle", type=float, default=20.0, help="seconds of silence to measure idle CPU over")
    ap.add_argument("--idle-only", action="store_true",
                    help="only idle CPU, in wake and open mode and of a bare stream (the floor), --repeat times")
    ap.add_argument("--repeat", type=int, default=2, help="idle measurements per mode with --idle-only")
    ap.add_argument("--v2v", type=int, default=5, metavar="N", help="voice-to-voice requests per listen mode")
    ap.add_argument("--v2v-only", action="store_true", help="only voice-to-voice, in wake and open mode")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", type=Path, help="keep recordings and logs here")
    args = ap.parse_args()
    reason = ensure_packages()
    if reason is not None:
        log(f"live benchmark: {reason}")
        return 2
    work = args.keep or Path(tempfile.mkdtemp(prefix="voice-live-bench-"))
    if args.v2v_only:
        with AudioServer() as server:
            runs = [live_v2v(server, work, args.v2v, mode) for mode in ("wake", "open")]
        print_v2v(runs)
        if args.json:
            args.json.write_text(json.dumps(runs, indent=2) + "\n")
        return 0
    if args.idle_only:
        modes = ("wake", "open", "floor")  # the floor: the bare stream alone, measured between them (idle_floor)
        with AudioServer() as server:
            runs = [idle_floor(server, args.idle) if mode == "floor"
                    else idle_cpu(server, work / str(i), args.idle, mode)
                    for i in range(args.repeat) for mode in modes]
        for i, r in enumerate(runs):
            r["mode"] = modes[i % len(modes)]
            print(f"{r['mode']:5} idle CPU {r['idle_cpu_pct']:.1f} % over {r['idle_window_s']:.0f} s "
                  f"(load average {r['load_avg_1min']:.1f}); by thread: "
                  + ", ".join(f"{name} {pct:.2f}" for name, pct in r["threads_pct"].items()))
        if args.json:
            args.json.write_text(json.dumps(runs, indent=2) + "\n")
        return 0
    with AudioServer() as server:
        result = output_delay(server, args.clicks)
        result.update(live_ack(server, work, args.conversations))
        result.update(idle_cpu(server, work, args.idle))
        result["v2v"] = [live_v2v(server, work, args.v2v, mode) for mode in ("wake", "open")] if args.v2v else []
    result["machine"] = {"cores": os.cpu_count()}
    c = result["cursor_error_ms"]
    rows = [
        ("output delay, measured (callback -> speaker.monitor, median)", result["measured_output_delay_ms_median"],
         "range {:.1f}-{:.1f}".format(*result["measured_output_delay_ms_range"])),
        ("output latency reported by sounddevice (stream.latency)", result["reported_latency_ms"], ""),
        ("PortAudio per-callback DAC delay (median)", result["portaudio_dac_delay_ms_median"] or float("nan"),
         "range {:.1f}-{:.1f}".format(*result["portaudio_dac_delay_ms_range"])
         if result["portaudio_dac_delay_ms_range"] else "not given by this host API"),
        ("cursor error, LiveDevice correction (mean; abs mean / abs p95)", c["livedevice"]["mean"],
         f"{c['livedevice']['abs_mean']:.1f} / {c['livedevice']['abs_p95']:.1f}; over 5 ms in "
         f"{c['livedevice']['over_5ms']} of {c['livedevice']['n']} reads (max {c['livedevice']['abs_max']:.1f})"),
        ("cursor error, static reported latency (mean; abs mean / abs p95)", c["static_reported"]["mean"],
         f"{c['static_reported']['abs_mean']:.1f} / {c['static_reported']['abs_p95']:.1f}"),
        ("live ack: barge-in onset in mic feed -> last reply sample (median)", result["live_ack_ms_median"],
         "n={} ({})".format(len(result["live_ack_ms"]), ", ".join(f"{a:.0f}" for a in result["live_ack_ms"]))),
        ("idle CPU of `voice run` on silence (%)", result["idle_cpu_pct"], f"{result['idle_window_s']:.0f} s window"),
        *((f"v2v live, {r['mode']} mode: request's last sample in mic feed -> reply's first on speaker (median)",
           r["medians"]["v2v_ms"], f"n={r['n']}; parts: end of turn {_ms(r['medians']['eot_ms'])} + recognition "
           f"{_ms(r['medians']['stt_ms'])} + turn start -> first reply sample {_ms(r['medians']['reply_ms'])}")
          for r in result["v2v"]),
    ]
    print("| metric | value (ms, or %) | note |\n|---|---|---|")
    for name, value, note in rows:
        print(f"| {name} | {value:.1f} | {note} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
