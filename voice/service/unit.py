"""`voice service install|uninstall`: the systemd user unit for this install."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from voice.paths import config_dir

_TEMPLATE_PACKAGED = Path(__file__).with_name("voice.service")  # in a wheel
_TEMPLATE_SOURCE = Path(__file__).resolve().parents[2] / "systemd" / "voice.service"  # in a checkout
UNIT = "voice.service"


def unit_path() -> Path:
    return config_dir().parent / "systemd" / "user" / UNIT


def voice_command() -> str:
    """The `voice` of this installation (the venv's script), as an absolute path."""
    script = Path(sys.argv[0]).resolve() if Path(sys.argv[0]).name == "voice" else None
    found = shutil.which("voice")
    if script is not None and script.exists():
        return str(script)
    if found:
        return str(Path(found).resolve())
    return f"{sys.executable} -m voice"


def render() -> str:
    template = _TEMPLATE_PACKAGED if _TEMPLATE_PACKAGED.exists() else _TEMPLATE_SOURCE
    return template.read_text().replace("@VOICE@", voice_command())


def install() -> str:
    path = unit_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(render())
    os.replace(tmp, path)
    return (f"wrote {path}\nstart it now and at every login:\n"
            f"  systemctl --user daemon-reload && systemctl --user enable --now {UNIT}\n"
            f"watch it: journalctl --user -u {UNIT} -f")


def uninstall() -> str:
    path = unit_path()
    if not path.exists():
        return f"no unit at {path}: nothing to remove"
    path.unlink()
    return (f"removed {path}\nif it was running: systemctl --user disable --now {UNIT}; "
            "systemctl --user daemon-reload")
