"""`voice service install|uninstall`: the systemd user unit for this install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from voice.paths import config_dir, shipped_file

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
    """The unit for this install: the template's own header comment (which
    explains the placeholder) replaced by one that says what was filled in."""
    template = shipped_file(__file__, "voice.service", "systemd")
    lines = template.read_text().splitlines(keepends=True)
    body = "".join(lines[next(i for i, line in enumerate(lines) if not line.startswith("#")):])
    command = voice_command()
    header = (f"# The voice assistant as a systemd user service, written by `voice service install`\n"
              f"# for {command}. Run it again after moving or reinstalling voice.\n")
    return header + body.replace("@VOICE@", command)


def install() -> str:
    path = unit_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(render())
    os.replace(tmp, path)
    return (f"wrote {path}\nstart it now and at every login:\n"
            f"  systemctl --user daemon-reload && systemctl --user enable --now {UNIT}\n"
            f"watch it: journalctl --user -u {UNIT} -f")


def _systemctl(*args: str) -> tuple[bool, str]:
    """`systemctl --user ARGS`: whether it worked, and what it said."""
    program = shutil.which("systemctl")
    if program is None:
        return False, "systemctl is not installed"
    try:
        proc = subprocess.run([program, "--user", *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    said = (proc.stderr or proc.stdout).strip().splitlines()
    return proc.returncode == 0, said[-1] if said else f"exit status {proc.returncode}"


def uninstall() -> str:
    """Stop and disable the service while its unit file is still there
    (systemctl needs it for that), then remove the file."""
    path = unit_path()
    if not path.exists():
        return f"no unit at {path}: nothing to remove"
    done = []
    disabled, said = _systemctl("disable", "--now", UNIT)
    if disabled:
        done.append(f"stopped and disabled {UNIT}")
    else:
        # No user manager to ask (or no systemd): nothing of ours can be running
        # under it; remove what `enable` left, the .wants links to this unit.
        links = [w for w in path.parent.glob(f"*.wants/{UNIT}") if w.is_symlink()]
        for link in links:
            link.unlink()
        done.append(f"could not ask systemd to disable {UNIT} ({said})"
                    + (f"; removed {', '.join(map(str, links))}" if links else ""))
    path.unlink()
    done.append(f"removed {path}")
    if disabled:
        _systemctl("daemon-reload")
        done.append("reloaded the user manager")
    return "\n".join(done)
