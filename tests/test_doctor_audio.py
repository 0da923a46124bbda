"""#36.6: `voice doctor` on a machine with no sound device says so, in one
line, with how to get one: start the audio server, plug one in, or make
virtual devices (the devices a running service has open, and PortAudio's
defaults with their rates, are checked on the live tests' PipeWire:
tests/live/test_live_muted_mic.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_doctor_says_there_is_no_sound_device_and_how_to_get_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICE_", "PULSE_", "PIPEWIRE_"))}
    # no audio server answers here: a runtime directory of our own, without its sockets
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"),
               XDG_RUNTIME_DIR=str(tmp_path / "run"), HF_HUB_OFFLINE="1")
    listed = subprocess.run([sys.executable, "-c", "import sounddevice; print(len(sounddevice.query_devices()))"],
                            env=env, capture_output=True, text=True, timeout=60)
    if listed.returncode != 0 or listed.stdout.strip() != "0":
        pytest.skip(f"this machine has sound devices without an audio server ({listed.stdout.strip()!r} listed)")
    (tmp_path / "replies.toml").write_text('[[reply]]\ntext = "Hi."\n')
    r = subprocess.run([sys.executable, "-m", "voice", "doctor", "--no-load", "--llm",
                        f"scripted:{tmp_path / 'replies.toml'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    audio = [ln for ln in r.stdout.splitlines() if ln.startswith(("[FAIL] microphone", "[FAIL] speaker"))]
    assert len(audio) == 1, r.stdout  # one line for no device at all, not one per side
    assert audio[0].startswith("[FAIL] microphone and speaker: no sound device: PortAudio finds none"), audio
    fix = audio[0].split(" -> ", 1)[1]
    assert "start the audio server" in fix and "systemctl --user start pipewire" in fix, fix
    assert f"`{sys.executable} -m sounddevice`" in fix and "audio_server.py" in fix and "voice replay" in fix, fix
    assert "audio in use" not in r.stdout  # no service runs
    assert r.stdout.splitlines()[-1] == "1 problem(s) would stop `voice run`", r.stdout
