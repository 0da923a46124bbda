"""What a test MCP server saw, one JSON object a line, synced to disk line by
line: a server that is killed or dies mid-call still leaves every event it
logged before, so a test can tell "never started" from "started, never
finished" from "cancelled". Standard library only: the SDK-free late_server
uses it too."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any


class Journal:
    """Appends events to a file; safe to call from several threads."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._lock = threading.Lock()

    def log(self, event: str, **fields: Any) -> None:
        if self._path is None:
            return
        line = json.dumps({"event": event, **fields, "t": time.time()}) + "\n"
        with self._lock, open(self._path, "a", encoding="utf-8") as journal_file:
            journal_file.write(line)
            journal_file.flush()
            os.fsync(journal_file.fileno())
