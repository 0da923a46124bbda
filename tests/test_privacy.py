"""Issue #11, finding 4: least privilege. Commands get a minimal, documented
environment; what the service writes is the user's alone; note text is
one printable line. (The control socket's directory: test_control_socket.py.)"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from killpoint import KillPoints
from voice.log import events as ev
from voice.log.store import EventStore

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-test-0123456789-not-for-commands"


def env_for(tmp: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(tmp / "state"), "XDG_DATA_HOME": str(tmp / "data"),
            "XDG_CONFIG_HOME": str(tmp / "config"), "HF_HUB_OFFLINE": "1", **extra}


def voice(tmp: Path, *args: str, stdin: str = "", umask: int | None = None, **extra: str):
    return subprocess.run([sys.executable, "-m", "voice", *args], cwd=ROOT, env=env_for(tmp, **extra), input=stdin,
                          capture_output=True, text=True, timeout=60,
                          preexec_fn=None if umask is None else lambda: os.umask(umask))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def tool_results(db: Path) -> list[dict]:
    store = EventStore(db)
    try:
        return [e.payload for e in store.events(types={ev.TOOL_RESULT})]
    finally:
        store.close()


def test_a_command_does_not_get_the_daemons_secrets(tmp_path):
    config = tmp_path / "voice.toml"
    config.write_text('[tools.commands]\nshowenv = ["env"]\n')
    out = voice(tmp_path, "chat", "--config", str(config), "--db", str(tmp_path / "ev.db"), stdin="run showenv\nyes\n",
                OPENAI_API_KEY=SECRET, GITHUB_TOKEN=SECRET, LANG="C.UTF-8")
    assert out.returncode == 0, out.stderr
    (result,) = tool_results(tmp_path / "ev.db")
    stdout = result["content"]["stdout"]
    names = {line.partition("=")[0] for line in stdout.splitlines()}
    assert SECRET not in stdout and SECRET not in out.stdout  # not in the log, not in what the model reads
    assert {"PATH", "HOME", "LANG"} <= names
    assert names <= {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ",
                     "TERM", "XDG_RUNTIME_DIR", "DISPLAY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS",
                     "VOICE_PROCESS_TAG"}, names


def test_the_environment_list_is_configurable(tmp_path):
    config = tmp_path / "voice.toml"
    config.write_text('[tools]\ncommand_env = ["PATH", "BACKUP_TARGET"]\n[tools.commands]\nshowenv = ["env"]\n')
    out = voice(tmp_path, "chat", "--config", str(config), "--db", str(tmp_path / "ev.db"), stdin="run showenv\nyes\n",
                BACKUP_TARGET="/media/usb", OPENAI_API_KEY=SECRET)
    assert out.returncode == 0, out.stderr
    (result,) = tool_results(tmp_path / "ev.db")
    names = {line.partition("=")[0] for line in result["content"]["stdout"].splitlines()}
    assert names == {"PATH", "BACKUP_TARGET", "VOICE_PROCESS_TAG"}


def test_the_log_notes_and_folders_are_the_users_alone(tmp_path):
    """A `voice chat` killed after its turn ended leaves the log with its
    -wal and -shm: all 0600, in 0700 folders, whatever the umask."""
    killpoints = KillPoints()
    try:
        run = killpoints.run(["chat"], env=env_for(tmp_path), out=tmp_path / "k", stdin="add a note buy milk\n",
                             kill_after=ev.TURN_END)
    finally:
        killpoints.close()
    assert run["signal"] == 9, run["stderr"]
    db = tmp_path / "state" / "voice" / "events.db"
    notes = tmp_path / "data" / "voice" / "notes.txt"
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), notes):
        assert mode(path) == 0o600, (path, oct(mode(path)))
    for folder in (db.parent, notes.parent):
        assert mode(folder) == 0o700, (folder, oct(mode(folder)))


def test_a_log_left_readable_by_an_older_version_is_made_private(tmp_path):
    db = tmp_path / "ev.db"
    assert voice(tmp_path, "chat", "--db", str(db), stdin="what time is it\n", umask=0o022).returncode == 0
    os.chmod(db, 0o644)  # as the code before issue #11 left it
    out = voice(tmp_path, "history", "--db", str(db))
    assert out.returncode == 0, out.stderr
    assert mode(db) == 0o644  # reading changes nothing (tests/test_reading_a_log.py): a log sent to you stays as it came
    out = voice(tmp_path, "chat", "--db", str(db), stdin="what time is it\n")  # the assistant writes to it again
    assert out.returncode == 0, out.stderr
    assert mode(db) == 0o600


def test_commands_still_get_the_users_umask(tmp_path):
    made = tmp_path / "made.txt"
    config = tmp_path / "voice.toml"
    config.write_text(f'[tools.commands]\ntouch = ["touch", "{made}"]\n')
    out = voice(tmp_path, "chat", "--config", str(config), "--db", str(tmp_path / "ev.db"), stdin="run touch\nyes\n",
                umask=0o022)
    assert out.returncode == 0, out.stderr
    assert mode(made) == 0o644  # the person's own files, as their umask says
    assert mode(tmp_path / "ev.db") == 0o600


def test_note_text_is_one_printable_line(tmp_path):
    script = tmp_path / "note.toml"
    text = "buy\\u001b[31m milk\\u0000 and\\u202e eggs\\u0007"
    script.write_text(f'[[reply]]\nchunk_delay_ms = 1\n[[reply.tool_calls]]\nname = "add_note"\n'
                      f'arguments = {{ text = "{text}" }}\n[[reply]]\nchunk_delay_ms = 1\ntext = "Saved."\n')
    out = voice(tmp_path, "chat", "--db", str(tmp_path / "ev.db"), "--llm", f"scripted:{script}", stdin="note\n")
    assert out.returncode == 0, out.stderr
    raw = (tmp_path / "data" / "voice" / "notes.txt").read_bytes()
    assert raw.count(b"\n") == 1 and not any(b < 0x20 and b != 0x09 and b != 0x0A for b in raw), raw
    assert raw.decode().endswith("\tbuy milk and eggs\n")
    (result,) = tool_results(tmp_path / "ev.db")
    assert result["content"]["note"] == "buy milk and eggs"  # what the model is told was saved
