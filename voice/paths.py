"""Where files live, by the XDG base directory rules."""

from __future__ import annotations

import os
from pathlib import Path


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
