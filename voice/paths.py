"""Where files live, by the XDG base directory rules."""

from __future__ import annotations

import os
from pathlib import Path


_user_umask: int | None = None


def make_files_private() -> None:
    """From here on every file and folder this process creates is the
    user's alone (umask 077): the log, notes and recordings hold what was
    said and done. The user's own umask is kept for the commands the
    assistant runs for them (`user_umask`)."""
    global _user_umask
    previous = os.umask(0o077)
    if _user_umask is None:
        _user_umask = previous


def user_umask() -> int:
    """The umask this process started with."""
    if _user_umask is not None:
        return _user_umask
    current = os.umask(0o077)
    os.umask(current)
    return current


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    return Path(value) if value and os.path.isabs(value) else Path.home() / fallback


def state_dir() -> Path:
    return _xdg("XDG_STATE_HOME", ".local/state") / "voice"


def config_dir() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config") / "voice"


def data_dir() -> Path:
    return _xdg("XDG_DATA_HOME", ".local/share") / "voice"


def default_db() -> Path:
    return state_dir() / "events.db"


def event_log(configured: str | Path = "") -> Path:
    """The event log: the configured path ([paths] db or --db), else the XDG default."""
    return Path(configured) if configured else default_db()


def control_socket(configured: str = "") -> Path:
    """The control socket: the configured path ([service] socket), else
    $XDG_RUNTIME_DIR/voice/control.sock, else in the state folder (never a
    shared /tmp path another user could create first)."""
    if configured:
        return Path(configured)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return Path(runtime) / "voice" / "control.sock"
    return state_dir() / "run" / "control.sock"


def shipped_file(beside: str, name: str, checkout_dir: str) -> Path:
    """A file the project ships: a wheel puts it beside the module `beside`
    (its __file__), a checkout keeps it in `checkout_dir` at the root."""
    packaged = Path(beside).with_name(name)
    return packaged if packaged.exists() else Path(__file__).resolve().parents[1] / checkout_dir / name
