"""Where the first reply's audio goes when the model decodes beside Piper (#26 point 2).

    flock /tmp/voice-bench.lock python benchmarks/piper_beside_llm.py [--runs 8] [--json OUT]

With the scripted model, Piper synthesises the first sentence on an idle
CPU; with a local model server, the server goes on decoding the rest of the
reply while Piper works, on the same cores (llm_v2v's "Piper + first block"
part: 409 ms against 119 scripted). This times `PiperEngine.synthesize` of
typical first sentences:

- alone, and while llama.cpp's server (SmolLM2-135M, 2 threads, as the slow
  tests start it: tests/llm_server.py) streams a long reply to another
  client, which is what it does during a real turn's first sentence;
- with Piper on onnxruntime's default threads (one per core) and on
  `--threads` others;
- with the server at `--server-nice` niceness: a local model server run
  at a lower priority than the voice (systemd's `Nice=`), which loses
  little decoding speed and gives the first sentence the cores.

It reports the median and p95 per case and the ratio to alone-on-defaults.
A measurement, not a test: run it on an otherwise idle machine and say how
loaded it was (`uptime`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from llm_server import missing, running_server  # noqa: E402

from voice.audio.device import MIC_RATE  # noqa: E402
from voice.speech.tts import PiperEngine  # noqa: E402

# First sentences of the length replies begin with (the soak's and SmolLM2's).
SENTENCES = ["Sure, here are three facts about the sea.", "It is a quarter past ten in the morning.",
             "The capital of France is Paris, on the river Seine.", "Okay, I set a timer for five minutes."]


class Decoding:
    """The server streaming long replies, one after another, until stopped:
    the model decoding as it does while a turn's first sentence is spoken."""

    def __init__(self, base_url: str, model: str):
        self._url, self._model = base_url.rstrip("/") + "/chat/completions", model
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.tokens = 0

    def __enter__(self) -> "Decoding":
        self._thread.start()
        time.sleep(1.0)  # past the prompt: decoding
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _run(self) -> None:
        body = json.dumps({"model": self._model, "stream": True, "max_tokens": 400, "temperature": 0.8,
                           "messages": [{"role": "user", "content": "Tell me a long story about the sea."}]})
        while not self._stop.is_set():
            request = urllib.request.Request(self._url, body.encode(), {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as response:
                for line in response:
                    if self._stop.is_set():
                        return
                    if line.startswith(b"data: {"):
                        self.tokens += 1


def time_synthesis(engine: PiperEngine, runs: int) -> list[float]:
    times = []
    for n in range(runs):
        started = time.perf_counter()
        engine.synthesize(SENTENCES[n % len(SENTENCES)])
        times.append((time.perf_counter() - started) * 1000)
    return times


def summary(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"p50_ms": round(statistics.median(times), 1),
            "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1), "n": len(times)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=8, help="synthesised sentences per case")
    parser.add_argument("--threads", type=int, nargs="*", default=[1], help="Piper thread counts besides the default")
    parser.add_argument("--server-nice", type=int, nargs="*", default=[0],
                        help="the server's niceness (every thread of it), one pass each: e.g. 0 10")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if (why := missing()) is not None:
        print(f"piper_beside_llm: {why}", file=sys.stderr)
        return 2
    engines = {threads: PiperEngine(MIC_RATE, threads=threads) for threads in [0, *args.threads]}
    for engine in engines.values():
        time_synthesis(engine, 2)  # warm-up: the first runs allocate
    result: dict = {"load_before": os.getloadavg(), "cases": {}}
    # Started at the lowest niceness asked for: raising it later needs no privilege, lowering it would.
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp), nice=min(args.server_nice)) as server:
        for threads, engine in engines.items():
            name = f"threads={threads or 'default'}"
            result["cases"][f"{name} alone"] = summary(time_synthesis(engine, args.runs))
            for nice in args.server_nice:
                server.renice(nice)
                case = f"{name} beside decoding" + (f", server nice {nice}" if nice else "")
                with Decoding(server.base_url, server.model) as decoding:
                    result["cases"][case] = summary(time_synthesis(engine, args.runs))
                result["cases"][case]["server_chunks"] = decoding.tokens
    base = result["cases"]["threads=default alone"]["p50_ms"]
    for name, case in result["cases"].items():
        case["x_alone_default"] = round(case["p50_ms"] / base, 2)
        print(f"{name:32} p50 {case['p50_ms']:7.1f} ms  p95 {case['p95_ms']:7.1f} ms  ({case['x_alone_default']}x)")
    result["load_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
