"""A child process's stdout and stderr, collected line by line as they come
(one reader thread each), so a test can wait for a line while the process
runs and read everything once it has ended."""

from __future__ import annotations

import subprocess
import threading


class OutputLines:
    def __init__(self, proc: subprocess.Popen):
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                         for stream, lines in ((proc.stdout, self.out), (proc.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def join(self, timeout: float = 5.0) -> None:
        """Once the process has ended: wait for the last lines."""
        for reader in self._readers:
            reader.join(timeout)
