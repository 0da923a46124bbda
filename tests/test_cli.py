"""The `voice` command line as a real subprocess: chat (piped, Ctrl-C = SIGINT
mid-reply), history, trace, fork, and bad input (one line on stderr, exit 2,
nothing already recorded lost)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(120)

LONG_TEXT = (
    "Here is a longer answer so that you have time to stop me: the kettle boils, "
    "the tea steeps for three minutes, then you add milk, stir twice, and drink it slowly."
)
assert 28 <= len(LONG_TEXT.split()) <= 32

FIRST_TEXT = "Hello, nice to meet you."
SECOND_TEXT = "The weather looks fine today."
TIME_TEXT = "It is just after noon."

_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


# --- helpers -------------------------------------------------------------------


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in _PROXY_VARS and k != "VOICE_DB"}
    e.update(
        XDG_STATE_HOME=str(tmp_path / "xdg-state"),
        XDG_CONFIG_HOME=str(tmp_path / "xdg-config"),
        XDG_DATA_HOME=str(tmp_path / "xdg-data"),
        HF_HUB_OFFLINE="1",
        NO_PROXY="*",
        PYTHONDONTWRITEBYTECODE="1",
    )
    e.pop("PYTHONSTARTUP", None)
    return e


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "events.db"


def voice(env: dict[str, str], *args: str, stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "voice", *args],
        cwd=REPO, env=env, input=stdin if stdin is not None else "",
        capture_output=True, text=True, timeout=timeout,
    )


def history(env: dict[str, str], db: Path, *extra: str) -> list[dict[str, Any]]:
    r = voice(env, "history", "--db", str(db), "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def write_script(path: Path, body: str) -> Path:
    path.write_text(body, encoding="utf-8")
    return path


def toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string literal is a valid TOML basic string here


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert line.startswith(("voice: error:", "voice chat: error:", "voice history: error:", "voice trace: error:",
                            "voice fork: error:")), line
    for needle in needles:
        assert needle in line, (needle, line)
    assert "Traceback" not in r.stderr
    return line


class _Reader(threading.Thread):
    """Collects a pipe's bytes as they arrive, so the test can watch output."""

    def __init__(self, fd: int):
        super().__init__(daemon=True)
        self.fd = fd
        self.buf = bytearray()
        self.lock = threading.Lock()

    def run(self) -> None:
        while True:
            chunk = os.read(self.fd, 4096)
            if not chunk:
                return
            with self.lock:
                self.buf += chunk

    def text(self) -> str:
        with self.lock:
            return self.buf.decode("utf-8", errors="replace")


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.002)


def turn_ended(db: Path) -> bool:
    from voice.log.events import TURN_END
    from voice.log.store import EventStore

    if not db.exists():
        return False
    store = EventStore(db)
    try:
        return any(e.type == TURN_END for e in store.events())
    finally:
        store.close()


def assistant_words(out: str) -> int:
    at = out.rfind("assistant: ")
    if at < 0:
        return 0
    return len(out[at + len("assistant: "):].split("\n")[0].split())


@pytest.fixture
def chatted(env: dict[str, str], db: Path, tmp_path: Path) -> list[dict[str, Any]]:
    """A successful two-turn chat recorded in `db`; returns its history."""
    script = write_script(
        tmp_path / "two.toml",
        f"[[reply]]\nchunk_delay_ms = 1\ntext = {toml_str(FIRST_TEXT)}\n"
        f"[[reply]]\nchunk_delay_ms = 1\ntext = {toml_str(SECOND_TEXT)}\n",
    )
    r = voice(env, "chat", "--db", str(db), "--new", "--llm", f"scripted:{script}", stdin="hello\nhow is the weather\n")
    assert r.returncode == 0, r.stderr
    h = history(env, db)
    assert len(h) == 4
    return h


# --- a. Ctrl-C mid-reply: the printed text is the delivered prefix ---------------


@pytest.mark.parametrize("cut_at_words", [5, 11, 18])
def test_sigint_mid_reply_records_exactly_the_printed_prefix(env, db, tmp_path, cut_at_words):
    script = write_script(tmp_path / "long.toml", f"[[reply]]\nchunk_delay_ms = 60\ntext = {toml_str(LONG_TEXT)}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "voice", "chat", "--db", str(db), "--new", "--llm", f"scripted:{script}"],
        cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
    )
    out, err = _Reader(proc.stdout.fileno()), _Reader(proc.stderr.fileno())
    out.start()
    err.start()
    try:
        proc.stdin.write(b"tell me about tea\n")
        proc.stdin.flush()
        wait_until(lambda: assistant_words(out.text()) >= cut_at_words, 20, f"{cut_at_words} words of the reply")
        assert proc.poll() is None, "the reply ended before the stop"
        proc.send_signal(signal.SIGINT)
        proc.stdin.close()
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    out.join(timeout=10)
    err.join(timeout=10)
    stdout, stderr = out.text(), err.text()

    assert code == 0, (code, stdout, stderr)
    assert "Traceback" not in stderr, stderr
    lines = stdout.splitlines()
    assert lines[0] == "you: tell me about tea"
    reply_lines = [line for line in lines if line.startswith("assistant: ")]
    assert len(reply_lines) == 1, stdout
    line = reply_lines[0]
    assert line.endswith(" [stopped]"), line
    printed = line[len("assistant: "):-len(" [stopped]")]
    assert len(printed.split()) >= cut_at_words

    h = history(env, db)
    assert h[0] == {"role": "user", "content": "tell me about tea"}
    last = h[-1]
    assert last["role"] == "assistant"
    assert last.get("interrupted") is True
    assert last["content"] == printed
    assert LONG_TEXT.startswith(last["content"]) and last["content"] != LONG_TEXT
    assert "tool_calls" not in last
    assert len(h) == 2

    trace = voice(env, "trace", "--db", str(db), "1", "--json")
    assert trace.returncode == 0, trace.stderr
    assert json.loads(trace.stdout)["outcome"] == "aborted"

    chat_view = voice(env, "history", "--db", str(db), "--chat")
    assert chat_view.returncode == 0, chat_view.stderr
    assert f"assistant: {printed} [stopped]" in chat_view.stdout.splitlines()


def test_sigint_at_the_prompt_exits(env, db, tmp_path):
    """Ctrl-C with no reply running ends the chat (chat.py's docstring)."""
    script = write_script(tmp_path / "one.toml", f"[[reply]]\nchunk_delay_ms = 1\ntext = {toml_str(FIRST_TEXT)}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "voice", "chat", "--db", str(db), "--new", "--llm", f"scripted:{script}"],
        cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
    )
    out = _Reader(proc.stdout.fileno())
    out.start()
    try:
        proc.stdin.write(b"hello\n")
        proc.stdin.flush()
        wait_until(lambda: FIRST_TEXT in out.text() and out.text().endswith("\n"), 20, "the whole reply")
        # No reply running (was 0.2 s of sleeping): the turn's end is in the log, and the loop
        # records it with no await before it lets go of the turn (voice/agent/loop.py).
        wait_until(lambda: turn_ended(db), 20, "the turn's end in the log")
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=10)  # stdin stays open: only the signal can end it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdin.close()
    out.join(timeout=10)
    stderr = proc.stderr.read().decode()
    assert code == 0, (code, out.text(), stderr)
    assert "Traceback" not in stderr
    assert history(env, db) == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": FIRST_TEXT}]


# --- b. piped chat to the end -----------------------------------------------------


def test_piped_chat_to_the_end(env, db, tmp_path):
    script = write_script(
        tmp_path / "two.toml",
        f"[[reply]]\nchunk_delay_ms = 5\ntext = {toml_str(FIRST_TEXT)}\n"
        f"[[reply]]\nchunk_delay_ms = 5\ntext = {toml_str(LONG_TEXT)}\n",
    )
    r = voice(env, "chat", "--db", str(db), "--new", "--llm", f"scripted:{script}", stdin="hello\n\nwhat about tea\n")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout.splitlines() == [
        "you: hello", f"assistant: {FIRST_TEXT}", "you: what about tea", f"assistant: {LONG_TEXT}"
    ]
    assert history(env, db) == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": FIRST_TEXT},
        {"role": "user", "content": "what about tea"},
        {"role": "assistant", "content": LONG_TEXT},
    ]


def test_chat_continues_the_latest_conversation(env, db, tmp_path, chatted):
    script = write_script(tmp_path / "more.toml", f"[[reply]]\nchunk_delay_ms = 1\ntext = {toml_str(TIME_TEXT)}\n")
    r = voice(env, "chat", "--db", str(db), "--llm", f"scripted:{script}", stdin="and the time\n")
    assert r.returncode == 0, r.stderr
    assert history(env, db) == chatted + [
        {"role": "user", "content": "and the time"}, {"role": "assistant", "content": TIME_TEXT}
    ]


# --- c. a tool call ---------------------------------------------------------------


def test_tool_call_then_text(env, db, tmp_path):
    script = write_script(
        tmp_path / "tool.toml",
        "[[reply]]\nchunk_delay_ms = 1\n[[reply.tool_calls]]\nname = \"get_time\"\narguments = {}\n"
        f"[[reply]]\nchunk_delay_ms = 1\ntext = {toml_str(TIME_TEXT)}\n",
    )
    r = voice(env, "chat", "--db", str(db), "--new", "--llm", f"scripted:{script}", stdin="what time is it\n")
    assert r.returncode == 0, r.stderr
    assert f"assistant: {TIME_TEXT}" in r.stdout.splitlines()

    h = history(env, db)
    assert [m["role"] for m in h] == ["user", "assistant", "tool", "assistant"]
    assert h[0] == {"role": "user", "content": "what time is it"}
    calls = h[1]["tool_calls"]
    assert len(calls) == 1
    assert calls[0]["type"] == "function"
    assert calls[0]["function"] == {"name": "get_time", "arguments": "{}"}
    assert h[1]["content"] == ""
    assert h[2]["tool_call_id"] == calls[0]["id"]
    result = json.loads(h[2]["content"])
    assert set(result) == {"iso", "spoken"}
    assert h[3] == {"role": "assistant", "content": TIME_TEXT}

    trace = json.loads(voice(env, "trace", "--db", str(db), "1", "--json").stdout)
    assert trace["outcome"] == "completed"
    assert [r_["tool_calls"] for r_ in trace["requests"]] == [["get_time"], []]
    assert any("tool get_time: ok" in step for step in trace["requests"][0]["lifecycle"])


# --- d. trace and fork ----------------------------------------------------------


def test_trace_prints_outcome_and_a_line_per_request(env, db, tmp_path):
    script = write_script(
        tmp_path / "tool.toml",
        f"[[reply]]\nchunk_delay_ms = 1\ntext = {toml_str(FIRST_TEXT)}\n"
        "[[reply]]\nchunk_delay_ms = 1\n[[reply.tool_calls]]\nname = \"get_time\"\n"
        f"[[reply]]\nchunk_delay_ms = 1\ntext = {toml_str(TIME_TEXT)}\n",
    )
    r = voice(env, "chat", "--db", str(db), "--new", "--llm", f"scripted:{script}", stdin="hello\nwhat time is it\n")
    assert r.returncode == 0, r.stderr

    t1 = voice(env, "trace", "--db", str(db), "1")
    assert t1.returncode == 0, t1.stderr
    lines = t1.stdout.splitlines()
    assert lines[0] == "turn 1: completed"
    assert len(lines) == 2 and "step 0 attempt 0" in lines[1] and "[scripted/tool.toml]" in lines[1]

    t2 = voice(env, "trace", "--db", str(db), "2")
    assert t2.returncode == 0, t2.stderr
    lines = t2.stdout.splitlines()
    assert lines[0] == "turn 2: completed"
    assert len(lines) == 3
    assert "step 0 attempt 0" in lines[1] and "get_time" in lines[1]
    assert "step 1 attempt 0" in lines[2] and "result" in lines[2]

    j = voice(env, "trace", "--db", str(db), "2", "--json")
    assert j.returncode == 0, j.stderr
    data = json.loads(j.stdout)
    assert data["turn"] == 2 and data["outcome"] == "completed"
    assert data["conversation"].startswith("c-")
    assert [(q["step"], q["attempt"], q["outcome"]) for q in data["requests"]] == [(0, 0, "result"), (1, 0, "result")]


@pytest.mark.parametrize("turn, upto", [(1, 2), (2, 4)])
def test_fork_has_the_history_up_to_the_turn(env, db, chatted, turn, upto):
    r = voice(env, "fork", "--db", str(db), str(turn))
    assert r.returncode == 0, r.stderr
    new_id = r.stdout.strip()
    assert new_id.startswith("c-") and "\n" not in new_id
    forked = history(env, db, "--conversation", new_id)
    assert forked == chatted[:upto]
    # the original is untouched; the fork is now the latest conversation
    original_id = json.loads(voice(env, "trace", "--db", str(db), "1", "--json").stdout)["conversation"]
    assert original_id != new_id
    assert history(env, db, "--conversation", original_id) == chatted
    assert history(env, db) == forked


def test_fork_of_a_stopped_turn_keeps_the_delivered_prefix(env, db, tmp_path):
    """I12 through the CLI: fork at an interrupted turn."""
    script = write_script(tmp_path / "long.toml", f"[[reply]]\nchunk_delay_ms = 60\ntext = {toml_str(LONG_TEXT)}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "voice", "chat", "--db", str(db), "--new", "--llm", f"scripted:{script}"],
        cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
    )
    out = _Reader(proc.stdout.fileno())
    out.start()
    try:
        proc.stdin.write(b"tea please\n")
        proc.stdin.flush()
        wait_until(lambda: assistant_words(out.text()) >= 7, 20, "7 words")
        proc.send_signal(signal.SIGINT)
        proc.stdin.close()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    out.join(timeout=10)
    original = history(env, db)
    assert original[-1].get("interrupted") is True
    r = voice(env, "fork", "--db", str(db), "1")
    assert r.returncode == 0, r.stderr
    assert history(env, db, "--conversation", r.stdout.strip()) == original


# --- e. bad input -------------------------------------------------------------------


def _bad_invocations(tmp_path: Path, db: Path, good_script: Path) -> dict[str, tuple[list[str], tuple[str, ...]]]:
    missing = tmp_path / "no-such-script.toml"
    malformed = write_script(tmp_path / "malformed.toml", "[[reply]\ntext = \"unclosed\n")
    unknown_key = write_script(tmp_path / "unknown-key.toml", "[[reply]]\ntext = \"hi\"\ndelay = 5\n")
    # a TOML integer where the words go: an error with its fix, never spoken as "5"
    number_text = write_script(tmp_path / "number-text.toml", "[[reply]]\ntext = \"hi\"\n[[reply]]\ntext = 5\n")
    bogus_cfg = write_script(tmp_path / "bogus.toml", "[llm]\nbogus = 1\n")
    typed_cfg = write_script(tmp_path / "typed.toml", "[llm]\nretries = \"x\"\n")
    missing_cfg = tmp_path / "no-such-config.toml"
    d, s = str(db), f"scripted:{good_script}"
    return {
        "unknown flag": (["chat", "--db", d, "--frobnicate", "--llm", s], ("--frobnicate",)),
        "missing script": (["chat", "--db", d, "--llm", f"scripted:{missing}"], (str(missing), "not found")),
        "malformed script": (["chat", "--db", d, "--llm", f"scripted:{malformed}"], (str(malformed), "TOML")),
        "unknown reply key": (["chat", "--db", d, "--llm", f"scripted:{unknown_key}"], ("delay", str(unknown_key))),
        "reply text not a string": (["chat", "--db", d, "--llm", f"scripted:{number_text}"],
                                    (str(number_text), "reply 2", "text = 5", 'text = "5"')),
        "unknown config key": (["chat", "--db", d, "--config", str(bogus_cfg), "--llm", s], ("llm.bogus",)),
        "wrongly typed config": (["chat", "--db", d, "--config", str(typed_cfg), "--llm", s], ("llm.retries", "integer")),
        "missing config": (["chat", "--db", d, "--config", str(missing_cfg), "--llm", s], (str(missing_cfg),)),
        "unreachable llm": (["chat", "--db", d, "--llm", "http://127.0.0.1:9/v1"], ("http://127.0.0.1:9/v1",)),
        "bad llm spec": (["chat", "--db", d, "--llm", "ftp://example"], ("ftp://example",)),
        "unknown turn": (["trace", "--db", d, "99"], ("99",)),
        "non-numeric turn": (["trace", "--db", d, "first"], ("first",)),
        "fork of unknown turn": (["fork", "--db", d, "99"], ("99",)),
        "unknown conversation": (["history", "--db", d, "--conversation", "c-nope"], ("c-nope",)),
        "missing subcommand": (["--db", d], ()),
    }


BAD_CASES = [
    "unknown flag", "missing script", "malformed script", "unknown reply key", "reply text not a string",
    "unknown config key",
    "wrongly typed config", "missing config", "unreachable llm", "bad llm spec", "unknown turn",
    "non-numeric turn", "fork of unknown turn", "unknown conversation", "missing subcommand",
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_one_line_exit_2_and_loses_nothing(env, db, tmp_path, chatted, case):
    good = write_script(tmp_path / "good.toml", f"[[reply]]\nchunk_delay_ms = 1\ntext = {toml_str(TIME_TEXT)}\n")
    cases = _bad_invocations(tmp_path, db, good)
    assert set(cases) == set(BAD_CASES)
    args, needles = cases[case]
    before_bytes = _event_rows(db)
    r = voice(env, *args, stdin="this line must not be chatted\n")
    assert_one_line_error(r, *needles)
    assert r.stdout == ""
    assert history(env, db) == chatted
    assert _event_rows(db) == before_bytes


def _event_rows(db: Path) -> list[tuple]:
    import sqlite3

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("SELECT * FROM events ORDER BY seq").fetchall()
    finally:
        con.close()


def test_history_of_an_empty_db(env, tmp_path):
    empty = tmp_path / "empty.db"
    r = voice(env, "history", "--db", str(empty), "--json")
    assert_one_line_error(r, "empty", str(empty))
    assert r.stdout == ""


def test_trace_of_a_missing_turn_in_an_empty_db(env, tmp_path):
    from voice.log.store import EventStore

    EventStore(tmp_path / "empty.db").close()  # a log with no events (a path with no log: tests/test_reading_a_log.py)
    r = voice(env, "trace", "--db", str(tmp_path / "empty.db"), "1")
    assert_one_line_error(r, "no turn 1")


def test_corrupt_db_is_one_line_error_and_left_alone(env, tmp_path):
    corrupt = tmp_path / "corrupt.db"
    junk = bytes(range(256)) * 64
    corrupt.write_bytes(junk)
    r = voice(env, "history", "--db", str(corrupt))
    assert_one_line_error(r, str(corrupt))
    assert corrupt.read_bytes() == junk


def test_nothing_touches_the_real_home(env, db, tmp_path, chatted):
    """Everything the runs wrote is under tmp_path: the XDG state dir is unused
    when --db is given, and no default db appeared."""
    state = Path(env["XDG_STATE_HOME"])
    assert not (state / "voice" / "events.db").exists()
    assert db.exists()


def test_default_db_lives_under_xdg_state_home(env, tmp_path):
    script = write_script(tmp_path / "one.toml", f"[[reply]]\nchunk_delay_ms = 1\ntext = {toml_str(FIRST_TEXT)}\n")
    r = voice(env, "chat", "--new", "--llm", f"scripted:{script}", stdin="hi\n")
    assert r.returncode == 0, r.stderr
    assert (Path(env["XDG_STATE_HOME"]) / "voice" / "events.db").exists()
    r = voice(env, "history", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": FIRST_TEXT}]


def test_a_server_that_listens_and_says_nothing_is_named_busy_not_a_cancelled_scope(env, db, tmp_path, chatted):
    # Seen in the README recipe test: llama-cpp-python's server, still busy with a reply (it answers nothing else
    # until that ends), made `voice chat` say "cannot reach ... (CancelledError: Cancelled via cancel scope ...;
    # reason: deadline exceeded); start the server", of a server that was running.
    import socket

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)  # accepted by the kernel, never answered
        url = f"http://127.0.0.1:{listening.getsockname()[1]}/v1"
        before = _event_rows(db)
        r = voice(env, "chat", "--db", str(db), "--llm", url, stdin="this line must not be chatted\n")
    line = assert_one_line_error(r, url, "did not answer within 2 s", "busy with another reply", "try again")
    assert "Cancel" not in line and "start the server" not in line, line
    assert history(env, db) == chatted and _event_rows(db) == before
