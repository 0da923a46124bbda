"""A typed conversation longer than the context budget, against a real
model server: per turn, the time from the person's line to the reply's first
character, and what the server evaluated for it (benchmarks/llm_v2v.py
--turns N runs it against tests/llm_server.py's llama.cpp server).

It drives `voice chat` as a person would, from outside (a real process,
stdin and stdout), so it measures whatever the agent does between turns
(summaries, window moves, cache warming) without calling into it. Each line
is typed `pause_s` after the previous reply ended; the figures leave out
the first turn, which waits for `voice chat` to start. Per turn:
- first_char_ms: line written -> first character of the reply on stdout;
- taken_ms: line written -> `voice chat` echoed it ("you: ..."), i.e. how
  long the line waited for the previous turn's work to finish;
- the server's requests, from its own log (llama-cpp-python 0.3.36 logs, per
  request, "Llama.generate: P prefix-match hit, remaining N prompt tokens to
  eval" and llama.cpp's "prompt eval time = T ms / N tokens"; its responses
  carry no cached/evaluated split: a streamed one has no usage at all, even
  with stream_options.include_usage, and a non-streamed one only
  usage.prompt_tokens, the whole prompt). llama-server, run with `-lv 4`,
  logs per task "task K | new prompt, ... task.n_tokens = P" when it starts
  and "task K | prompt eval time = T ms / N tokens" when it ends: the cached
  prefix is P - N. The request being decoded when the first character
  arrives is the turn's; the others ended between the line and the next
  line (summaries, warming) are counted beside it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]

QUESTIONS = [
    "What is the capital of France?", "How many legs does a spider have?", "What colour is the sky on Mars?",
    "Name a fruit that is yellow.", "What is two plus three?", "Which planet is closest to the sun?",
    "What do bees make?", "How many days are in a week?", "What is the opposite of hot?",
    "Which animal is known as the king of the jungle?", "What language is spoken in Brazil?",
    "What is frozen water called?", "How many minutes are in an hour?", "What is the largest ocean?",
    "What gas do plants breathe in?", "Who wrote Romeo and Juliet?", "What is the boiling point of water?",
    "Name a musical instrument with strings.", "What do cows drink?", "How many continents are there?",
    "What is the tallest animal?", "What shape has three sides?", "What season comes after winter?",
    "Which metal is liquid at room temperature?", "What is the main ingredient of bread?",
    "What do you call a baby cat?", "How many hours are in a day?", "What is the color of grass?",
    "Name a bird that cannot fly.", "What is the capital of Japan?",
]
TURN_TIMEOUT_S = 300.0  # one turn on a loaded 2-core machine: generous, but a hang must end
_PREFIX = re.compile(rb"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")
_CACHED = re.compile(rb"Llama\.generate: full prompt already cached")
_PERF = re.compile(rb"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
# llama-server's (-lv 4) per-task lines, each naming its task: a task that starts, one that ends.
_TASK_PROMPT = re.compile(rb"\| task (\d+) \| new prompt, [^\n]*task\.n_tokens = (\d+)")
_TASK_PERF = re.compile(rb"\| task (\d+) \| \s*prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")


@dataclass
class ServerRequest:
    """One generation as the server's log tells it."""
    start: int  # log offset where it began (its prefix line, else the previous request's end)
    end: int  # log offset of its "prompt eval time" line, printed when it finished
    cached_tokens: int  # the prompt prefix it reused from its KV cache
    evaluated_tokens: int
    prompt_eval_ms: float


@dataclass
class Turn:
    turn: int
    line: str
    sent: int = 0  # server log offsets at the line, at its first character, at the next line
    first: int = 0
    done: int = 0
    taken_ms: float | None = None
    first_char_ms: float | None = None
    reply_ms: float | None = None
    reply: str = ""
    server: dict = field(default_factory=dict)


def server_requests(log: bytes) -> list[ServerRequest]:
    """The generations in a server's log, llama-cpp-python's or llama-server's."""
    if _TASK_PROMPT.search(log):
        return _llama_server_requests(log)
    out: list[ServerRequest] = []
    start, cached = 0, 0
    for m in re.finditer(_PREFIX.pattern + b"|" + _CACHED.pattern + b"|" + _PERF.pattern, log):
        if m.group(1) is not None:  # a prefix line opens a request
            start, cached = m.start(), int(m.group(1))
        elif m.group(3) is not None:
            out.append(ServerRequest(start, m.start(), cached, int(m.group(4)), float(m.group(3))))
            start, cached = m.end(), 0
        else:  # full prompt cached: nothing to evaluate
            start, cached = m.start(), -1
    return out


def _llama_server_requests(log: bytes) -> list[ServerRequest]:
    """llama-server's tasks: its slots may run several at once, so each end
    is matched to its start by the task's id."""
    started: dict[bytes, tuple[int, int]] = {}
    out: list[ServerRequest] = []
    for m in re.finditer(_TASK_PROMPT.pattern + b"|" + _TASK_PERF.pattern, log):
        if m.group(1) is not None:
            started[m.group(1)] = (m.start(), int(m.group(2)))
        elif (begun := started.pop(m.group(3), None)) is not None:
            start, prompt_tokens = begun
            evaluated = int(m.group(5))
            out.append(ServerRequest(start, m.start(), prompt_tokens - evaluated, evaluated, float(m.group(4))))
    return out


def attribute(turns: list[Turn], requests: list[ServerRequest]) -> None:
    """Each turn's own request (the one under way when its first character
    came) and the others that ended between its line and the next one."""
    for t in turns:
        mine = [r for r in requests if r.start < t.first <= r.end]
        own = mine[-1] if mine else None
        before = [r for r in requests if t.sent <= r.end < t.first and r is not own]
        after = [r for r in requests if t.first <= r.end < t.done and r is not own]  # summaries, warming
        t.server = {
            "own": asdict(own) if own else None,
            "requests_before_first_char": len(before),
            "evaluated_before_first_char": sum(r.evaluated_tokens for r in before),
            "eval_ms_before_first_char": round(sum(r.prompt_eval_ms for r in before), 1),
            "requests_after_reply": len(after),
            "most_evaluated_after_reply": max((r.evaluated_tokens for r in after), default=0),
        }


async def _read_until(stdout, buf: bytearray, marker: bytes, start: int) -> int:
    """Read stdout into buf until marker appears at or after start; its index."""
    while (i := buf.find(marker, start)) < 0:
        try:
            buf += await stdout.receive()
        except anyio.EndOfStream:
            raise RuntimeError(f"voice chat ended before {marker!r}:\n{buf[-2000:].decode(errors='replace')}") from None
    return i


async def _read_reply_end(stdout, buf: bytearray, server_log: Path, since: int) -> None:
    """Until the server has finished the generation under way at `since` (its
    "prompt eval time" line) and stdout has gone quiet after a line end: a
    reply may hold newlines of its own, so stdout alone cannot say."""
    finished = False
    while True:
        with anyio.move_on_after(0.2) as quiet:
            buf += await stdout.receive()
        if quiet.cancelled_caught:
            if finished and buf.endswith(b"\n"):
                return
            finished = finished or bool(_PERF.search(_log(server_log)[since:]))


def _log(path: Path) -> bytes:
    return path.read_bytes()


async def converse(base_url: str, model: str, server_log: Path, workdir: Path, turns: int, *,
                   context_tokens: int = 1024, pause_s: float = 1.0, budget_s: float | None = None,
                   progress=print) -> tuple[list[Turn], str]:
    """The conversation, and why it stopped early ("" when it did not):
    with budget_s, no turn starts after that many seconds (a loaded machine
    may not get through them all; the turns done are still reported)."""
    config = workdir / "voice.toml"
    config.write_text(f'[llm]\nprovider = "openai"\nbase_url = "{base_url}"\nmodel = "{model}"\ntimeout_s = 120\n'
                      f"context_tokens = {context_tokens}\n")
    cmd = [sys.executable, "-m", "voice", "chat", "--new", "--db", str(workdir / "events.db"), "--config", str(config)]
    env = {**os.environ, "XDG_CONFIG_HOME": str(workdir / "xdg-config"), "XDG_STATE_HOME": str(workdir / "xdg-state"),
           "PYTHONUNBUFFERED": "1"}
    done: list[Turn] = []
    stopped = ""
    with open(workdir / "chat.stderr", "wb") as stderr:
        async with await anyio.open_process(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=stderr) as proc:
            try:
                stopped = await _talk(proc, turns, server_log, pause_s, budget_s, progress, done)
            finally:
                await proc.stdin.aclose()  # end of input: voice chat exits
                with anyio.move_on_after(30):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
    return done, stopped


async def _talk(proc, turns: int, server_log: Path, pause_s: float, budget_s: float | None, progress,
                done: list[Turn]) -> str:
    buf = bytearray()
    size = lambda: server_log.stat().st_size  # noqa: E731
    began = time.perf_counter()
    stopped = ""
    for n in range(turns):
        if budget_s is not None and time.perf_counter() - began > budget_s:
            stopped = f"the {budget_s:.0f} s budget ran out after {n} of {turns} turns"
            break
        line = QUESTIONS[n % len(QUESTIONS)]
        t = Turn(n + 1, line)
        try:
            with anyio.fail_after(TURN_TIMEOUT_S):
                t.sent, sent = size(), time.perf_counter()
                await proc.stdin.send(line.encode() + b"\n")
                echo = await _read_until(proc.stdout, buf, f"you: {line}\n".encode(), len(buf))
                t.taken_ms = (time.perf_counter() - sent) * 1000
                label = await _read_until(proc.stdout, buf, b"assistant: ", echo)
                t.first_char_ms = (time.perf_counter() - sent) * 1000
                t.first = size()
                await _read_reply_end(proc.stdout, buf, server_log, t.first)
                t.reply_ms = (time.perf_counter() - sent) * 1000
                t.reply = buf[label + len(b"assistant: "):].decode(errors="replace").strip()
        except TimeoutError:
            stopped = f"turn {t.turn} had no whole reply within {TURN_TIMEOUT_S} s"
            break
        if done:
            done[-1].done = t.sent
        done.append(t)
        progress(f"turn {t.turn:3d}: first char {t.first_char_ms:7.0f} ms (taken {t.taken_ms:6.0f}) "
                 f"reply {t.reply_ms:7.0f} ms  {t.reply[:60]!r}")
        await anyio.sleep(pause_s)
    await anyio.sleep(pause_s)  # the last turn's after-work gets its pause too
    if done:
        done[-1].done = size()
    return stopped


def summarize(all_turns: list[Turn]) -> dict:
    """Over the turns after the first: the first one waits for `voice chat`
    itself to start (its taken_ms)."""
    from common import stats

    turns = all_turns[1:] or all_turns
    first = stats([t.first_char_ms for t in turns])
    ordered = sorted(t.first_char_ms for t in turns)
    slowest = ordered[-max(1, len(ordered) // 20):]  # the slowest 5 %
    own = [t.server["own"] for t in turns if t.server.get("own")]
    return {
        "turns": len(turns), "first_turn_ms": all_turns[0].first_char_ms,
        "first_char_ms": first,
        "slowest_5pct_ms": slowest,
        "slowest_5pct_min_over_median": round(slowest[0] / first["p50"], 2) if first["p50"] else None,
        "slowest_5pct_mean_over_median": round(sum(slowest) / len(slowest) / first["p50"], 2) if first["p50"] else None,
        "taken_ms": stats([t.taken_ms for t in turns]),
        "evaluated_tokens": stats([r["evaluated_tokens"] for r in own]),
        "cached_tokens": stats([r["cached_tokens"] for r in own]),
        "turns_with_requests_before_first_char": sum(1 for t in turns if t.server.get("requests_before_first_char")),
        # Idle work (summaries, cache warming): the most prompt one of its requests had the server evaluate,
        # which is what a turn that came meanwhile could wait for: a server cannot stop an evaluation part-way.
        "idle_requests": sum(t.server.get("requests_after_reply", 0) for t in turns),
        "idle_most_evaluated_tokens": max((t.server.get("most_evaluated_after_reply", 0) for t in turns), default=0),
    }


def write_csv(turns: list[Turn], path: Path) -> None:
    cols = ["turn", "first_char_ms", "taken_ms", "reply_ms", "cached_tokens", "evaluated_tokens", "prompt_eval_ms",
            "requests_before_first_char", "evaluated_before_first_char", "eval_ms_before_first_char",
            "requests_after_reply", "most_evaluated_after_reply"]
    rows = [",".join(cols)]
    for t in turns:
        own = t.server.get("own") or {}
        vals = {"turn": t.turn, "first_char_ms": round(t.first_char_ms, 1), "taken_ms": round(t.taken_ms, 1),
                "reply_ms": round(t.reply_ms, 1), **{k: own.get(k, "") for k in cols[4:7]},
                **{k: t.server.get(k, "") for k in cols[7:]}}
        rows.append(",".join(str(vals[c]) for c in cols))
    path.write_text("\n".join(rows) + "\n")
