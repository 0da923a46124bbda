"""The daemon (issue #5): systemd notify lifecycle, shutdown as the
cancellation protocol, the control socket, config, the unit and doctor.
The daemon runs for real (`voice run --replay`, paced in real time)."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autojump import on_autojump
from output_lines import OutputLines
from voice.log import events as ev
from voice.log.store import EventStore

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "tests" / "fixtures" / "scenarios"

pytestmark = pytest.mark.slow


def env_for(tmp: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "XDG_RUNTIME_DIR": str(tmp / "run"), "XDG_STATE_HOME": str(tmp / "state"),
            "XDG_DATA_HOME": str(tmp / "data"), "XDG_CONFIG_HOME": str(tmp / "config"), "HF_HUB_OFFLINE": "1",
            **extra}


def voice(tmp: Path, *args: str, timeout: float = 60, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voice", *args], cwd=ROOT, env=env_for(tmp, **extra),
                          capture_output=True, text=True, timeout=timeout)


class Daemon:
    def __init__(self, tmp: Path, scenario: Path, watchdog_usec: int = 1_000_000, open_files: int | None = None,
                 extra_args: tuple[str, ...] = (), **env: str):
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "run").mkdir(mode=0o700, exist_ok=True)
        self.tmp, self.db = tmp, tmp / "events.db"
        self.notify_path = str(tmp / "notify.sock")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.notify.settimeout(0.05)
        self.messages: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "voice", "run", "--db", str(self.db), "--replay", str(scenario), *extra_args],
            cwd=ROOT, env=env_for(tmp, NOTIFY_SOCKET=self.notify_path, WATCHDOG_USEC=str(watchdog_usec), **env),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=None if open_files is None else lambda: resource.setrlimit(
                resource.RLIMIT_NOFILE, (open_files, resource.getrlimit(resource.RLIMIT_NOFILE)[1])))
        self.socket = tmp / "run" / "voice" / "control.sock"
        self._lines = OutputLines(self.proc)
        self.out, self.err = self._lines.out, self._lines.err  # the transcript (stdout) as it comes

    def err_text(self) -> str:
        return "\n".join(self.err)

    def pump(self, until, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert self.proc.poll() is None, self.err_text()
            assert time.monotonic() < deadline, f"timed out; notify messages {self.messages}"
            try:
                self.messages.append(self.notify.recv(256).decode())
            except TimeoutError:
                pass

    def events(self):
        store = EventStore(self.db)
        try:
            return store.events()
        finally:
            store.close()

    def stop(self) -> float:
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(20)
        elapsed = time.monotonic() - started
        self._lines.join()
        try:
            while True:
                self.messages.append(self.notify.recv(256).decode())
        except (TimeoutError, OSError):
            pass
        self.notify.close()
        return elapsed


def ask(path: Path, *requests: dict | bytes, timeout: float = 60.0) -> list[dict]:
    """Send requests on one connection; one reply line each."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        f = s.makefile("rwb")
        replies = []
        for r in requests:
            f.write(r if isinstance(r, bytes) else json.dumps(r).encode() + b"\n")
            f.flush()
            replies.append(json.loads(f.readline()))
        return replies


def test_lifecycle_notifies_and_sigterm_mid_reply_closes_the_turn(tmp_path):
    d = Daemon(tmp_path, SCENARIOS / "cut_after_stream.toml")
    d.pump(lambda: "READY=1" in d.messages)
    # mid-reply: the first answer's speech has started playing
    d.pump(lambda: any(e.type == ev.ASSISTANT_MESSAGE for e in d.events()))
    time.sleep(1.5)
    d.pump(lambda: d.messages.count("WATCHDOG=1") >= 2)
    elapsed = d.stop()  # stop() waits at most 20 s: the deadline for a hang
    assert d.proc.returncode == 0, f"shutdown took {elapsed:.1f} s"
    # Was also `elapsed < 5.0` (service.shutdown_s): a speed claim a loaded machine breaks; the
    # daemon bounds its own shutdown by that (voice/speech/session.py), and the exit status and
    # the one interrupted turn below are what it must reach within it.
    order = [m for m in d.messages if m in ("READY=1", "WATCHDOG=1", "STOPPING=1")]
    assert order[0] == "READY=1" and order[-1] == "STOPPING=1" and "WATCHDOG=1" in order[1:-1]
    events = d.events()
    ends = [e for e in events if e.type == ev.TURN_END]
    assert [e.payload["outcome"] for e in ends] == [ev.INTERRUPTED]
    assert d.out[-1].startswith("assistant: ") and d.out[-1].endswith(" [stopped]"), d.out  # however it ended
    (played,) = [e for e in events if e.type == ev.SPEECH_PLAYED]
    assert played.payload["complete"] is False and 0 < played.payload["chars"]
    assert not (tmp_path / "run" / "voice" / "control.sock").exists()  # removed on the way out


@pytest.mark.anyio
@on_autojump  # 20 ms keep-alive intervals on the virtual clock: a loaded machine cannot skew the count
async def test_no_watchdog_when_the_pipeline_stalls():
    """The heartbeat is the pipeline's progress, not the process's life."""
    import anyio

    from voice.service.notify import watchdog

    sent, position = [], [0]

    async def advance_then_stall():
        for _ in range(5):
            position[0] += 320
            await anyio.sleep(0.02)

    with anyio.move_on_after(0.3):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watchdog, lambda: position[0], 0.02, sent.append)
            await advance_then_stall()
            await anyio.sleep(10)  # stalled from here on
    assert 3 <= len(sent) <= 6  # keep-alives while audio advanced, none after
    before = len(sent)
    with anyio.move_on_after(0.2):
        await watchdog(lambda: position[0], 0.02, sent.append)
    assert len(sent) == before


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("daemon")
    scenario = tmp / "idle.toml"
    scenario.write_text(f'[[user]]\naudio = "{SCENARIOS.parent / "audio" / "what_time.wav"}"\nat = 0.3\n')
    d = Daemon(tmp, scenario)
    d.pump(lambda: "READY=1" in d.messages and d.socket.exists())
    d.pump(lambda: any(e.type == ev.TURN_END for e in d.events()))  # the spoken question was answered
    yield d
    d.stop()


def test_socket_is_private(daemon):
    mode = stat.S_IMODE(daemon.socket.stat().st_mode)
    assert mode == 0o600
    assert stat.S_IMODE(daemon.socket.parent.stat().st_mode) == 0o700


def test_status_and_say_run_a_spoken_turn(daemon):
    (status,) = ask(daemon.socket, {"cmd": "status"})
    assert status["ok"] and status["state"] in ("listening", "speaking", "thinking")
    assert status["llm"]["provider"] == "skills" and status["stt"] == "base"
    (reply,) = ask(daemon.socket, {"cmd": "say", "text": "set a timer for one minute"})
    assert reply["ok"] and reply["outcome"] == ev.COMPLETED
    assert reply["reply"] == "Done, your timer for one minute is set."
    effects = [e for e in daemon.events() if e.type == ev.EFFECT_RECEIPT]
    assert effects[-1].payload["state"] == "confirmed"
    (history,) = ask(daemon.socket, {"cmd": "history"})
    assert history["messages"][-1]["content"] == "Done, your timer for one minute is set."


def test_malformed_requests_get_errors_and_change_nothing(daemon):
    before = len(daemon.events())
    replies = ask(daemon.socket, b"this is not json\n", b"[1, 2]\n", {"cmd": "dance"}, {"cmd": "say"},
                  {"cmd": "status"})
    assert [r["ok"] for r in replies] == [False, False, False, False, True]
    assert "malformed request" in replies[0]["error"] and "known: status" in replies[2]["error"]
    assert len(daemon.events()) == before  # nothing was recorded for them
    assert daemon.proc.poll() is None


def test_two_clients_at_once_and_events_stream(daemon):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as watcher:
        watcher.settimeout(30)
        watcher.connect(str(daemon.socket))
        w = watcher.makefile("rwb")
        w.write(b'{"cmd": "events"}\n')
        w.flush()
        assert json.loads(w.readline())["streaming"] == "events"
        (reply,) = ask(daemon.socket, {"cmd": "say", "text": "what time is it"})  # a second client
        assert reply["ok"] and reply["reply"].startswith("It is")
        seen = []
        while not any(e["type"] == ev.TURN_END for e in seen):
            seen.append(json.loads(w.readline()))
        seen = [e for e in seen if e["type"] != ev.AUDIO_CLOCK]  # the device's clock, noted before each turn
        assert seen[0]["type"] == ev.TURN_START and seen[1]["payload"]["content"] == "what time is it"


def test_mute_unmute_and_cancel(daemon):
    assert ask(daemon.socket, {"cmd": "mute"})[0]["muted"] is True
    assert ask(daemon.socket, {"cmd": "status"})[0]["state"] == "muted"
    assert ask(daemon.socket, {"cmd": "unmute"})[0]["muted"] is False
    assert ask(daemon.socket, {"cmd": "cancel"})[0] == {"ok": True, "cancelled": False}  # nothing running


def test_voice_ctl_client(daemon):
    out = voice(daemon.tmp, "ctl", "status", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["ok"]
    out = voice(daemon.tmp, "ctl", "say", "what", "time", "is", "it", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["reply"].startswith("It is")


def test_voice_ctl_speaks_to_people_by_default(daemon):
    out = voice(daemon.tmp, "ctl", "status")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("state: ") and "language model: skills builtin" in lines
    assert not out.stdout.lstrip().startswith("{")
    out = voice(daemon.tmp, "ctl", "say", "what", "time", "is", "it")
    assert out.returncode == 0 and out.stdout.startswith("assistant: It is") and out.stdout.count("\n") == 1
    out = voice(daemon.tmp, "ctl", "history")
    assert out.returncode == 0 and "user: what time is it" in out.stdout.splitlines()
    out = voice(daemon.tmp, "ctl", "history", "--json")
    assert json.loads(out.stdout)["messages"][-1]["role"] == "assistant"


def test_ctl_events_since_prints_and_exits_and_follow_streams(daemon):
    last = daemon.events()[-1].seq
    out = voice(daemon.tmp, "ctl", "events", "--since", str(last - 3))
    assert out.returncode == 0, out.stderr
    # (a timer set by an earlier test may add events meanwhile: they come after)
    assert [int(ln.split()[0].lstrip("#")) for ln in out.stdout.splitlines()][:3] == [last - 2, last - 1, last]
    out = voice(daemon.tmp, "ctl", "events", "--since", str(last - 1), "--json")
    assert [json.loads(ln).get("seq") for ln in out.stdout.splitlines()][1:2] == [last]  # after the stream's header
    # Started with SIGINT ignored, as a script's background job is (and as this suite's process came to pass it
    # on: both CI runs of 2026-12-03 hung here): Ctrl-C still stops a follow, which says so.
    follow = subprocess.Popen([sys.executable, "-m", "voice", "ctl", "events", "--follow"], cwd=ROOT,
                              env=env_for(daemon.tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        # connected once it says so (on stderr): from then on every event comes
        assert "following the log" in follow.stderr.readline()
        assert voice(daemon.tmp, "ctl", "say", "what time is it").returncode == 0
        seen = []
        while not any(" turn/end " in ln for ln in seen):
            seen.append(follow.stdout.readline())
        assert all(int(ln.split()[0].lstrip("#")) > last for ln in seen)
        seen = [ln for ln in seen if " audio/clock " not in ln]  # the device's clock, noted before each turn
        assert " turn/start " in seen[0]
        assert follow.poll() is None  # a stream: it goes on until stopped
    finally:
        follow.send_signal(signal.SIGINT)
        assert follow.wait(10) == 0


def test_ctl_without_a_daemon_says_how_to_start_one(tmp_path):
    out = voice(tmp_path, "ctl", "status")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "voice run" in out.stderr


# -- #12: the transcript tells the whole story; ctl in scripts --------------------------


def test_the_transcript_of_a_service_tells_the_whole_story(tmp_path):
    """Wake word named at start-up; with -v the speech it ignored; `you:`
    for a `ctl say` turn; the timer's line; `[stopped]` for a reply cut by
    SIGTERM; and `ctl say` cut by that stop fails with one line."""
    scenario = tmp_path / "wake.toml"
    scenario.write_text(f'[listen]\nmode = "wake"\n[[user]]\naudio = "{SCENARIOS.parent / "audio" / "what_time.wav"}"\n'
                        "at = 0.3\n")
    d = Daemon(tmp_path, scenario, extra_args=("-v",))
    try:
        d.pump(lambda: "READY=1" in d.messages and d.socket.exists())
        d.pump(lambda: any("without the wake word" in ln for ln in d.out), timeout=30)
        said = voice(tmp_path, "ctl", "say", "set a timer for 1 second")
        assert said.returncode == 0, said.stderr
        d.pump(lambda: any(ln.startswith("notice: ") for ln in d.out), timeout=20)
        asking = subprocess.Popen([sys.executable, "-m", "voice", "ctl", "say", "what can you do"], cwd=ROOT,
                                  env=env_for(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        d.pump(lambda: any(e.type == ev.ASSISTANT_MESSAGE and e.turn == 2 for e in d.events()))
        d.stop()
        cut_off = asking.communicate(timeout=20)
    finally:
        if d.proc.poll() is None:
            d.stop()
    assert d.proc.returncode == 0
    assert 'say "okay nabu" first' in d.err_text()
    lines = d.out
    assert lines[0].startswith("(ignored: ") and "without the wake word" in lines[0], lines
    talk = [ln for ln in lines if not ln.startswith("(")]
    assert talk[0] == "you: set a timer for 1 second", lines
    assert talk[1:3] in (["assistant: Done, your timer for one second is set.", "notice: Your one second timer is done."],
                         ["notice: Your one second timer is done.", "assistant: Done, your timer for one second is set."])
    assert talk[3] == "you: what can you do" and talk[4].startswith("assistant: ") and talk[4].endswith(" [stopped]")
    assert asking.returncode == 1 and cut_off[1].count("\n") == 1, cut_off
    assert cut_off[1].startswith("voice: error: ") and "closed the connection before it answered" in cut_off[1]
    ends = [e.payload["outcome"] for e in d.events() if e.type == ev.TURN_END]
    assert ends == [ev.COMPLETED, ev.INTERRUPTED]


# -- config --------------------------------------------------------------------


def test_environment_overrides_and_their_sources(tmp_path):
    out = voice(tmp_path, "config", "show", VOICE_LLM_BASE_URL="http://127.0.0.1:8080/v1", VOICE_VAD_START_SECS="0.2")
    assert out.returncode == 0, out.stderr
    assert 'base_url = "http://127.0.0.1:8080/v1"  # env VOICE_LLM_BASE_URL' in out.stdout
    assert "start_secs = 0.2  # env VOICE_VAD_START_SECS" in out.stdout
    assert 'model = "llama3.2"  # default' in out.stdout


@pytest.mark.parametrize("var,value,named", [
    ("VOICE_LLM_BOGUS", "1", "VOICE_LLM_BOGUS"),
    ("VOICE_VAD_START_SECS", "soon", "VOICE_VAD_START_SECS"),
    ("VOICE_TOOLS_KILL_AFTER_S", '"x"', "VOICE_TOOLS_KILL_AFTER_S"),
])
def test_bad_environment_values_fail_in_one_line(tmp_path, var, value, named):
    out = voice(tmp_path, "config", "show", **{var: value})
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and named in out.stderr


def test_bad_command_config_fails_at_start(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[tools.commands]\nbackup = "rsync -a a b"\n')
    out = voice(tmp_path, "chat", "--config", str(cfg), "--db", str(tmp_path / "e.db"))
    assert out.returncode == 2 and "tools.commands.backup" in out.stderr and "list of strings" in out.stderr


# -- unit and doctor -------------------------------------------------------------


def test_service_install_writes_a_notify_unit_for_this_install(tmp_path):
    out = voice(tmp_path, "service", "install")
    assert out.returncode == 0 and "systemctl --user daemon-reload && systemctl --user enable --now voice.service" in out.stdout
    unit = (tmp_path / "config" / "systemd" / "user" / "voice.service").read_text()
    assert "Type=notify" in unit and "WatchdogSec=" in unit and "Restart=on-failure" in unit
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    program = exec_start.removeprefix("ExecStart=").split()[0]
    assert Path(program).is_absolute() and Path(program).exists() and exec_start.endswith(" run")
    out = voice(tmp_path, "service", "uninstall")
    assert out.returncode == 0 and not (tmp_path / "config" / "systemd" / "user" / "voice.service").exists()


def test_doctor_names_each_problem_and_its_fix(tmp_path):
    out = voice(tmp_path, "doctor", "--no-load", "--llm", "http://127.0.0.1:9/v1", timeout=90)
    lines = out.stdout.splitlines()
    llm = next(line for line in lines if "language model" in line)
    assert llm.startswith("[FAIL]") and "127.0.0.1:9" in llm and "->" in llm
    assert out.returncode == 1
    if any(line.startswith("[FAIL] microphone") for line in lines):  # this machine has no sound card
        mic = next(line for line in lines if "microphone" in line)
        assert "audio_server.py" in mic and "pipewire-alsa" in mic and "[audio] input" in mic


@pytest.mark.timeout(30)  # a blocking send would hang here: the deadline for that, not a speed claim
def test_notify_never_blocks_when_systemd_does_not_read(tmp_path, monkeypatch):
    from voice.service.notify import notify

    path = str(tmp_path / "n.sock")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    # Was also "the 2,000 sends took under 2 s": what shows it never blocks is that, once the
    # queue is full, a send returns False at once instead of waiting for room.
    sent = [notify("WATCHDOG=1") for _ in range(2000)]  # far more than the socket queue holds
    assert sent[0] is True and sent[-1] is False
    receiver.close()


def test_ctl_say_while_the_sound_card_is_gone_answers_in_writing_at_once(tmp_path):
    """F1: a request typed while the speaker is lost is answered, in writing
    (`ctl say`'s output and the transcript), and `ctl say` returns at once: it
    used to wait for a speaker that plays nothing, past the card's return,
    until `voice ctl cancel`."""
    scenario = tmp_path / "lost.toml"  # the sound card goes at 1 s and is away longer than the test runs
    scenario.write_text(f'[[user]]\naudio = "{SCENARIOS.parent / "audio" / "what_time.wav"}"\nat = 170.0\n'
                        "[[audio_lost]]\nat = 1.0\nback_after = 120.0\n")
    d = Daemon(tmp_path, scenario)
    try:
        d.pump(lambda: any(e.type == ev.AUDIO_LOST for e in d.events()), timeout=90)
        typed = voice(tmp_path, "ctl", "say", "what time is it", timeout=30)  # (the bound: it hung for ever)
        assert typed.returncode == 0, typed.stderr
        assert typed.stdout.startswith("assistant (not said aloud): It is") and typed.stdout.count("\n") == 1, \
            typed.stdout
        status = voice(tmp_path, "ctl", "status")
        assert "turn: none running" in status.stdout.splitlines(), status.stdout
        d.pump(lambda: any(line.startswith("notice: It is") and line.endswith("(not said: the audio device was lost)")
                           for line in d.out), timeout=10)
        d.stop()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    assert d.proc.returncode == 0
    events = d.events()
    (end,) = [e for e in events if e.type == ev.TURN_END]
    assert end.body.outcome == ev.COMPLETED and not [e for e in events if e.type == ev.AUDIO_BACK]
    played = [e.payload for e in events if e.type == ev.SPEECH_PLAYED]
    assert played and all(p["samples"] == 0 for p in played) and not played[-1]["complete"], played  # nothing played
