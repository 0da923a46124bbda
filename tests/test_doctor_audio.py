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


def skip_unless_portaudio_finds_no_device(env: dict[str, str]) -> None:
    listed = subprocess.run([sys.executable, "-c", "import sounddevice; print(len(sounddevice.query_devices()))"],
                            env=env, capture_output=True, text=True, timeout=60)
    if listed.returncode != 0 or listed.stdout.strip() != "0":
        pytest.skip(f"this machine has sound devices without an audio server ({listed.stdout.strip()!r} listed)")


def test_doctor_says_there_is_no_sound_device_and_how_to_get_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICE_", "PULSE_", "PIPEWIRE_"))}
    # no audio server answers here: a runtime directory of our own, without its sockets
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"),
               XDG_RUNTIME_DIR=str(tmp_path / "run"), HF_HUB_OFFLINE="1")
    skip_unless_portaudio_finds_no_device(env)
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
    assert "`voice run` starts anyway, and waits for one" in audio[0], audio  # (it did: "would stop `voice run`")
    assert r.stdout.splitlines()[-1] == "1 problem(s) to fix before `voice run` can hear and answer", r.stdout


@pytest.mark.slow  # a `voice run --replay` daemon: it loads the speech models
def test_doctor_while_the_service_has_lost_its_audio_says_it_is_retrying(tmp_path):
    """F6 (#36): with the sound card gone under a running service, doctor's
    no-device line is a warning about now that says the service is retrying
    and will listen again by itself, not a problem that would stop `voice
    run` (it said "[FAIL] ... no sound device" and "1 problem(s)")."""
    from test_service import SCENARIOS, Daemon, env_for
    from voice.log import events as ev

    env = {k: v for k, v in env_for(tmp_path).items() if not k.startswith(("VOICE_", "PULSE_", "PIPEWIRE_"))}
    skip_unless_portaudio_finds_no_device(env)
    scenario = tmp_path / "lost.toml"  # the sound card goes at 1 s and stays away while the test runs
    scenario.write_text(f'[[user]]\naudio = "{SCENARIOS.parent / "audio" / "what_time.wav"}"\nat = 170.0\n'
                        "[[audio_lost]]\nat = 1.0\nback_after = 120.0\n")
    (tmp_path / "replies.toml").write_text('[[reply]]\ntext = "Hi."\n')
    d = Daemon(tmp_path, scenario)
    try:
        d.pump(lambda: any(e.type == ev.AUDIO_LOST for e in d.events()), timeout=90)
        r = subprocess.run([sys.executable, "-m", "voice", "doctor", "--no-load", "--llm",
                            f"scripted:{tmp_path / 'replies.toml'}"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
        d.stop()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stdout.splitlines()
    (audio,) = [ln for ln in lines if ln.startswith(("[FAIL] microphone", "[warn] microphone"))]
    assert audio.startswith("[warn] microphone and speaker: no sound device now (PortAudio finds none); the "
                            "running service's audio: lost "), audio
    assert "retrying" in audio and "listens again by itself" in audio and "start the audio server" in audio, audio
    assert any(ln.startswith("[warn] audio in use: by the running service: lost ") for ln in lines), r.stdout
    assert not any(ln.startswith("[FAIL]") and "sound device" in ln for ln in lines), r.stdout
