"""DIR/requests.json of a replay, written as each model request is asked.

The file is one JSON list, one entry a request: the messages the scripted
model was sent, for parity checks against the recorded session. It was
written at the end from every request held in memory; a request carries the
whole message window (hundreds of messages once the conversation is long),
so a 400-turn replay held about 0.15 MB more per turn and a killed replay
left no file at all. Now each request is appended as it comes and the
closing bracket written after it, so the file is whole JSON after every
request (a replay killed mid-write leaves at most that one entry cut).
"""

from __future__ import annotations

import json
from pathlib import Path

from voice.agent.providers.base import ModelRequest


class RequestsFile:
    def __init__(self, path: Path):
        self.path = path
        self.count = 0
        self._file = path.open("wb")
        self._end = self._file.write(b"[")  # where the list's entries end: the next one goes there
        self._close_list(b"]\n")

    def add(self, request: ModelRequest) -> None:
        self._file.seek(self._end)
        entry = json.dumps(list(request.messages), indent=1).encode()
        self._file.write((b"\n" if self.count == 0 else b",\n") + entry)
        self._end = self._file.tell()
        self._close_list(b"\n]\n")
        self.count += 1

    def close(self) -> None:
        self._file.close()

    def _close_list(self, closing: bytes) -> None:
        self._file.write(closing)
        self._file.truncate()
        self._file.flush()
