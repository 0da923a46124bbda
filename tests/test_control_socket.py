"""Issue #11, finding 3: no client can take the daemon down. Each hostile
client of the issue runs against a live daemon (`voice run --replay`, with
the usual limit of 1,024 open files), which must still answer `status`
afterwards; and the socket's directory is checked (finding 4)."""

from __future__ import annotations

import json
import os
import resource
import socket
import stat
import time
from pathlib import Path

import pytest

from test_service import SCENARIOS, Daemon, ask, voice
from voice.log import events as ev

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    scenario = tmp / "idle.toml"
    scenario.write_text(f'[[user]]\naudio = "{SCENARIOS.parent / "audio" / "what_time.wav"}"\nat = 0.3\n')
    d = Daemon(tmp, scenario, open_files=1024)
    d.pump(lambda: "READY=1" in d.messages and d.socket.exists())
    d.pump(lambda: any(e.type == ev.TURN_END for e in d.events()))
    yield d
    d.stop()


def still_answers(d: Daemon) -> None:
    assert d.proc.poll() is None, d.proc.stderr.read()
    (status,) = ask(d.socket, {"cmd": "status"}, timeout=30)
    assert status["ok"] is True, status


def answers_again(d: Daemon, timeout: float = 30.0) -> None:
    """Ask `status` until the daemon is no longer over its connection limit
    (it notices closed clients on its own time: there is no event to wait on)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            (status,) = ask(d.socket, {"cmd": "status"}, timeout=30)
        except (BrokenPipeError, ConnectionResetError):  # refused and closed before the request was written
            status = {"ok": False, "error": "too many connections"}
        if status["ok"]:
            return
        assert "too many connections" in status.get("error", ""), status
        assert time.monotonic() < deadline, f"still over the connection limit {timeout:g} s after the clients left"
        time.sleep(0.05)


def raw(d: Daemon, data: bytes, *, read: bool = True) -> dict | None:
    """Send bytes on a new connection; the first reply line, if asked for."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(d.socket))
        s.sendall(data)
        return json.loads(s.makefile("rb").readline()) if read else None


def turns(d: Daemon) -> list[ev.Event]:
    return [e for e in d.events() if e.type in (ev.TURN_START, ev.TURN_END)]


def test_a_say_whose_client_left_before_the_reply(daemon):
    before = len(turns(daemon))
    raw(daemon, b'{"cmd": "say", "text": "what time is it"}\n', read=False)  # gone at once
    daemon.pump(lambda: len(turns(daemon)) == before + 2)  # the turn still runs to its one end
    time.sleep(0.5)  # its reply has nowhere to go
    still_answers(daemon)


def test_a_client_that_sends_many_requests_and_leaves_after_the_first_reply(daemon):
    first = raw(daemon, b'{"cmd": "history"}\n' * 300)
    assert first is not None and first["ok"]
    time.sleep(0.5)
    still_answers(daemon)


@pytest.mark.parametrize("line,error", [
    (b"[" * 30_000 + b"\n", "nested deeper than"),
    (b'{"cmd": "events", "after": 1' + b"0" * 30 + b"}\n", "out of range"),
    (b'{"cmd": "events", "after": -1}\n', "sequence number"),
    (b'{"cmd": "status", "x": NaN}\n', "NaN"),
    (b'{"cmd": "say", "text": "\xff\xfe"}\n', "not UTF-8"),
    (b"x" * 70_000 + b"\n", "longer than"),
], ids=["deep-nesting", "huge-integer", "negative-after", "nan", "not-utf8", "long-line"])
def test_hostile_lines_get_an_error_reply(daemon, line, error):
    reply = raw(daemon, line)
    assert reply is not None and reply["ok"] is False and error in reply["error"], reply
    still_answers(daemon)


def test_a_lone_surrogate_is_refused_and_nothing_is_recorded(daemon):
    before = daemon.events()
    reply = raw(daemon, b'{"cmd": "say", "text": "hello \\ud800 there"}\n')
    assert reply is not None and reply["ok"] is False and "not valid Unicode" in reply["error"]
    time.sleep(0.3)
    assert len(daemon.events()) == len(before)  # no turn opened, none left open
    still_answers(daemon)


def test_more_connections_than_file_descriptors(daemon):
    """1,100 idle clients against a daemon allowed 1,024 open files: the
    ones over the limit are told so; once they go, it answers again."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:  # this test process holds the 1,100 clients
        if hard != resource.RLIM_INFINITY and hard < 1200:
            pytest.skip(f"the test process may open only {hard} files")
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096 if hard == resource.RLIM_INFINITY else min(hard, 4096), hard))
    clients = []
    try:
        for _ in range(1100):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(30)
            s.connect(str(daemon.socket))
            clients.append(s)
        refused = clients[-1].makefile("rb").readline()
        assert b"too many connections" in refused
        assert daemon.proc.poll() is None
    finally:
        for s in clients:
            s.close()
    answers_again(daemon)  # was 0.5 s of sleeping: now until the daemon has seen the clients go
    still_answers(daemon)
    assert ask(daemon.socket, {"cmd": "say", "text": "what time is it"})[0]["ok"]


# -- the socket's directory (finding 4) ---------------------------------------------------------


def run_briefly(tmp: Path, **env: str):
    tmp.mkdir(parents=True, exist_ok=True)
    scenario = tmp / "idle.toml"
    scenario.write_text(f'[[user]]\naudio = "{SCENARIOS.parent / "audio" / "what_time.wav"}"\nat = 0.3\n')
    return voice(tmp, "run", "--db", str(tmp / "events.db"), "--replay", str(scenario), timeout=120, **env)


@pytest.mark.parametrize("problem", ["mode 0777", "another owner", "a symlink"])
def test_a_socket_directory_that_is_not_private_is_refused(tmp_path, problem):
    directory = tmp_path / "run" / "voice"
    directory.parent.mkdir(mode=0o700)
    if problem == "a symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        directory.symlink_to(tmp_path / "elsewhere")
    else:
        directory.mkdir()
        os.chmod(directory, 0o777 if problem == "mode 0777" else 0o700)
        if problem == "another owner":
            os.chown(directory, 65534, 65534)
    out = run_briefly(tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert str(directory) in out.stderr
    assert {"mode 0777": "chmod 700", "another owner": "belongs to uid 65534",
            "a symlink": "not a directory"}[problem] in out.stderr
    assert not (tmp_path / "elsewhere" / "control.sock").exists()


def test_without_xdg_runtime_dir_the_socket_is_private_in_the_users_state(tmp_path):
    (tmp_path / "run").mkdir(mode=0o700)
    scenario = tmp_path / "idle.toml"
    scenario.write_text(f'[[user]]\naudio = "{SCENARIOS.parent / "audio" / "what_time.wav"}"\nat = 0.3\n')
    d = Daemon(tmp_path, scenario, XDG_RUNTIME_DIR="")
    try:
        expected = tmp_path / "state" / "voice" / "run" / "control.sock"
        d.pump(lambda: "READY=1" in d.messages and expected.exists())
        assert stat.S_IMODE(expected.parent.stat().st_mode) == 0o700
        assert not Path(f"/tmp/voice-{os.getuid()}").joinpath("voice", "control.sock").exists()
        out = voice(tmp_path, "ctl", "status", "--json", XDG_RUNTIME_DIR="")
        assert out.returncode == 0 and json.loads(out.stdout)["ok"], out.stderr
    finally:
        d.stop()
