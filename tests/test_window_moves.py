"""No turn waits for the window to move (issue #26, point 1), from the
outside: `voice chat` as a process, typed turns paced like a person's,
against a loopback OpenAI-compatible server that records every request.

- Summaries and the cache-warming request come in idle time, after a reply
  and before the next typed turn; a turn's own request is never preceded on
  its path by one.
- Consecutive turn requests share their prefix except where the window
  moves; it moves by a large step (at most every few turns), and the server
  was sent the moved prefix (one token asked) before the turn that uses it.
- A turn typed while a summary request is still unanswered goes on at once.
- As `voice chat` starts, the first turn's prefix is warmed before a line
  is typed (issue #38).
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from loopback_llm import LoopbackLLM, _chunk

# Both tests pace `voice chat` like a person, in real time (17 s and 7 s). One group (`--dist loadgroup`
# hands groups out before single tests) so they start early instead of being left to the end of a run.
pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("window_moves")]

QUIET_S = 0.5  # the server heard nothing for this long after a reply: the person's pause is over
WAIT_S = 20.0  # the most any one expected request may take to arrive
LINE = "chat: question {n} " + "x" * 60


class RecordingLLM(LoopbackLLM):
    """The loopback server, telling the kinds of request apart (a turn's, a
    summary, a cache warming: one token asked), each with when it came; a
    summary request can be held unanswered until `release` is set."""

    def __init__(self, hold_summaries: bool = False, hold_warms: bool = False):
        super().__init__()
        self.hold_warms = hold_warms  # a warming request is answered only once its client has gone, or after WAIT_S
        self.warms_dropped: list[float] = []  # when a held warming request's client closed its connection
        self._connection = threading.local()
        handler = self._http.RequestHandlerClass
        post, recording = handler.do_POST, self

        def do_post(handler_self) -> None:
            recording._connection.socket = handler_self.connection
            post(handler_self)

        handler.do_POST = do_post
        self.heard: list[tuple[float, str, list[dict[str, Any]], list[Any]]] = []
        self.hold_summaries = hold_summaries
        self.release = threading.Event()
        self.summary_held = threading.Event()
        self.holding = False  # a summary request is being held unanswered now
        self._lock = threading.Lock()

    def reply(self, messages: list[dict[str, Any]]) -> list[bytes]:
        body = next(b for b in reversed(self.requests) if b["messages"] is messages)  # (requests may overlap)
        kind = ("summary" if str(messages[0].get("content", "")).startswith("Summarise")
                else "warm" if body.get("max_tokens") == 1 else "turn")
        with self._lock:
            self.heard.append((time.monotonic(), kind, messages, body.get("tools") or []))
        if kind == "summary" and self.hold_summaries:
            self.holding = True
            self.summary_held.set()
            self.release.wait(2 * WAIT_S)  # (longer than a turn is waited for: before the fix, the turn timed out)
            self.holding = False
        if kind == "warm" and self.hold_warms:
            self._wait_for_the_client_to_leave()
        if kind == "warm":
            return [_chunk({"role": "assistant", "content": "Ok"}), _chunk({}, "length")]
        return super().reply(messages)

    def _wait_for_the_client_to_leave(self) -> None:
        conn = self._connection.socket
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if select.select([conn], [], [], 0.02)[0] and not conn.recv(1, socket.MSG_PEEK):
                with self._lock:
                    self.warms_dropped.append(time.monotonic())
                return

    def of(self, kind: str) -> list[tuple[float, str, list[dict[str, Any]], list[Any]]]:
        with self._lock:
            return [h for h in self.heard if h[1] == kind]

    def last_heard(self) -> float:
        with self._lock:
            return self.heard[-1][0] if self.heard else 0.0


def wait_for(condition, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def start_chat(tmp: Path, server: RecordingLLM, *args: str) -> subprocess.Popen:
    config = tmp / "voice.toml"
    config.write_text("[llm]\ncontext_tokens = 1024\nreply_tokens = 128\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_RUNTIME_DIR": str(tmp / "run"),
           "XDG_CONFIG_HOME": str(tmp / "config"), "XDG_STATE_HOME": str(tmp / "state"),
           "XDG_DATA_HOME": str(tmp / "data")}
    return subprocess.Popen([sys.executable, "-m", "voice", "chat", "--db", str(tmp / "events.db"), "--config",
                             str(config), "--llm", server.base_url, *args], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env, text=True)


def say(chat: subprocess.Popen, server: RecordingLLM, n: int) -> float:
    """Type line n; wait for its turn's request. When it was typed."""
    line = LINE.format(n=n)
    typed = time.monotonic()
    chat.stdin.write(line + "\n")
    chat.stdin.flush()
    wait_for(lambda: any(h[2][-1].get("content") == line for h in server.of("turn")), f"the request of turn {n}")
    return typed


def pause(server: RecordingLLM) -> None:
    """The person is silent until the server has heard nothing for a while."""
    wait_for(lambda: time.monotonic() - server.last_heard() > QUIET_S, "a quiet server")


def finish(chat: subprocess.Popen) -> None:
    chat.stdin.close()
    try:
        assert chat.wait(timeout=30) == 0, chat.stderr.read()
    finally:
        if chat.poll() is None:
            chat.kill()


def oldest_user(messages: list[dict[str, Any]]) -> str:
    return next(m["content"] for m in messages if m["role"] == "user")


def test_the_window_moves_by_a_large_step_off_the_turns_path_and_warm(tmp_path):
    turns = 30
    with RecordingLLM() as server:
        chat = start_chat(tmp_path, server)
        typed = []
        for n in range(turns):
            typed.append(say(chat, server, n))
            pause(server)
        finish(chat)
    asked = server.of("turn")
    assert len(asked) == turns
    # (a) Idle work comes after a reply, never between a typed line and its turn's request.
    for n in range(1, turns):
        between = [h for h in server.heard if typed[n] <= h[0] < asked[n][0] and h[1] != "turn"]
        assert between == [], f"turn {n} waited for {[h[1] for h in between]}"
    assert server.of("summary"), "the conversation went past the budget: turns that left were summarised"
    # (b) Each request is the one before with the reply and the new words appended, except where the
    # window moves; it moves by a large step, and the moved prefix was warmed before the turn used it.
    moves = []
    for n in range(1, turns):
        before, now = asked[n - 1], asked[n]
        assert now[3] == before[3], "the tool schemas are the same, in the same order"
        if now[2][:len(before[2])] == before[2]:
            continue
        warmed = [h for h in server.of("warm") if asked[n - 1][0] < h[0] < now[0]]
        assert warmed and warmed[-1][2] == now[2][:-1], f"turn {n}'s new prefix was not warmed before it"
        if oldest_user(now[2]) != oldest_user(before[2]):
            moves.append(n)
    assert len(moves) >= 2, moves
    gaps = [b - a for a, b in zip(moves, moves[1:])]
    assert min(gaps) >= 4, f"the window moved at turns {moves}: one turn at a time"


def test_a_turn_typed_while_a_summary_is_pending_does_not_wait_for_it(tmp_path):
    with RecordingLLM(hold_summaries=True) as server:
        chat = start_chat(tmp_path, server)
        try:
            n = 0
            while not server.summary_held.is_set():
                assert n < 40, "no summary was asked for"
                say(chat, server, n)
                n += 1
                wait_for(lambda: server.summary_held.is_set() or time.monotonic() - server.last_heard() > QUIET_S,
                         "a summary or a quiet server")
            say(chat, server, n)  # the summary is still unanswered: the turn goes on
            answered_while_held = server.holding
        finally:
            server.release.set()
        finish(chat)
    assert answered_while_held


def test_the_first_turn_s_prefix_is_warmed_as_chat_starts(tmp_path):
    """#38: as `voice chat` starts, before a line is typed, the server is
    sent the prefix the first turn's request will begin with (the system
    prompt and the tool schemas), for one token: the first answer does not
    wait for the server to evaluate them (508 tokens with SmolLM2 and the
    built-in tools, a second of llama-server on 2 cores, measured:
    benchmarks/RESULTS.md). `voice run` does the same (voice.speech.turns)."""
    with RecordingLLM() as server:
        chat = start_chat(tmp_path, server)
        wait_for(lambda: server.of("warm"), "the request that warms the first turn's prefix")
        say(chat, server, 0)
        pause(server)
        finish(chat)
    [warm], [turn] = server.of("warm"), server.of("turn")
    assert warm[0] < turn[0]
    assert warm[2][0] == turn[2][0] and warm[2][0]["role"] == "system", "the same system prompt first"
    assert warm[3] == turn[3] and turn[3], "the same tool schemas, in the same order"


@pytest.mark.slow  # (Whisper, Piper and Silero load for the replay)
def test_the_first_turn_s_prefix_is_warmed_as_the_voice_service_starts(tmp_path):
    """#38, the spoken path: `voice replay` (the pipeline `voice run` runs)
    with a request 2 s in: before it, as the session starts, the server is
    sent the first turn's prefix for one token."""
    audio = Path(__file__).resolve().parent / "fixtures" / "audio" / "what_time.wav"
    with RecordingLLM() as server:
        scenario = tmp_path / "scenario.toml"
        scenario.write_text(f'max_duration = 20\n\n[[user]]\naudio = "{audio}"\nat = 2.0\n')
        config = tmp_path / "voice.toml"
        config.write_text(f'[llm]\nprovider = "openai"\nbase_url = "{server.base_url}"\nmodel = "m"\n')
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp_path / "xdg-config")}
        proc = subprocess.run([sys.executable, "-m", "voice", "replay", str(scenario), "--out", str(tmp_path / "out"),
                               "--config", str(config), "--stt-model", "tiny.en"], env=env, capture_output=True,
                              text=True, timeout=150)
        assert proc.returncode == 0, proc.stderr[-3000:]
    warms, turns = server.of("warm"), server.of("turn")
    assert warms and turns, [h[1] for h in server.heard]
    assert warms[0][0] < turns[0][0], "warmed before the first turn's request"
    assert warms[0][2][0] == turns[0][2][0] and warms[0][2][0]["role"] == "system", "the same system prompt first"
    assert warms[0][3] == turns[0][3] and turns[0][3], "the same tool schemas, in the same order"



def test_a_chat_opened_and_left_at_once_does_not_change_which_conversation_comes_next(tmp_path):
    """A hostile tester's finding: the warming request of a chat opened on
    an old conversation (`--conversation`) and left before a line was typed
    was recorded in it, which made it the latest: the next `voice chat`
    went on with it, not with the conversation the person had been in."""
    import json

    with RecordingLLM() as server:
        for args, line in (((), "chat: apples"), (("--new",), "chat: bananas")):
            chat = start_chat(tmp_path, server, *args)
            chat.stdin.write(line + "\n")
            chat.stdin.flush()
            wait_for(lambda: any(h[2][-1].get("content") == line for h in server.of("turn")), line)
            pause(server)
            finish(chat)
        listed = subprocess.run([sys.executable, "-m", "voice", "history", "--db", str(tmp_path / "events.db"),
                                 "--list", "--json"], capture_output=True, text=True, timeout=60)
        first = json.loads(listed.stdout)[0]["conversation"]
        warms = len(server.of("warm"))
        chat = start_chat(tmp_path, server, "--conversation", first)  # opened on the old one, and left at once
        wait_for(lambda: len(server.of("warm")) > warms, "the old conversation's warming request")
        finish(chat)
        chat = start_chat(tmp_path, server)
        chat.stdin.write("chat: which fruit\n")
        chat.stdin.flush()
        wait_for(lambda: any(h[2][-1].get("content") == "chat: which fruit" for h in server.of("turn")), "the turn")
        pause(server)
        finish(chat)
    said = [m.get("content") for m in server.of("turn")[-1][2] if m["role"] == "user"]
    assert said == ["chat: bananas", "chat: which fruit"], said


def test_start_over_cancels_the_warming_of_the_conversation_it_ends(tmp_path):
    """A hostile tester's finding: "start over" typed while the start's
    warming request still ran left it running (the server kept evaluating a
    conversation that had ended); the new conversation now cancels it."""
    with RecordingLLM(hold_warms=True) as server:
        chat = start_chat(tmp_path, server)
        say(chat, server, 0)
        pause(server)
        finish(chat)
        warms = len(server.of("warm"))
        chat = start_chat(tmp_path, server)
        wait_for(lambda: len(server.of("warm")) > warms, "the start's warming request")
        typed = time.monotonic()
        chat.stdin.write("start over\n")
        chat.stdin.flush()
        wait_for(lambda: server.warms_dropped, "the warming request dropped by the client", timeout=5)
        finish(chat)
    assert server.warms_dropped[0] - typed < 2.0
