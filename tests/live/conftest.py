"""The live tests' one private PipeWire with its virtual speaker and microphone
(tests/live/audio_server.py), per test module; they skip, saying why, where it
cannot be installed or started."""

from __future__ import annotations

import pytest

from .audio_server import AudioServer, AudioServerError, ensure_packages


@pytest.fixture(scope="module")
def audio():
    reason = ensure_packages()
    if reason is not None:
        pytest.skip(f"live audio: {reason}")
    try:
        server = AudioServer().start()
    except (AudioServerError, OSError) as exc:
        pytest.skip(f"live audio: cannot start a private PipeWire ({exc})")
    yield server
    server.stop()
