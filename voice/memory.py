"""Handing freed memory back to the system, so a service's RSS stays flat.

Whisper, Piper, Silero and Python free what a turn used, but glibc keeps
freed pages in its per-thread arenas for reuse; with inputs of a different
size on every turn the kept share creeps up (benchmarks/soak.py reports the
heap's in-use and free parts beside RSS). `malloc_trim(0)` gives the free
pages back. It runs in the event loop's executor (whose threads the models
already use: no thread of its own) after a turn settles, at most once every
`every_s`, and is a no-op where the C library has no such call.
"""

from __future__ import annotations

import asyncio
import ctypes
import time

_libc: ctypes.CDLL | None = None
try:
    _libc = ctypes.CDLL("libc.so.6")
    _libc.malloc_trim.argtypes = [ctypes.c_size_t]
except (OSError, AttributeError):  # not glibc
    _libc = None


class MemoryTrimmer:
    def __init__(self, every_s: float = 30.0) -> None:
        self.every_s = every_s
        self.trims = 0
        self._last = float("-inf")

    async def after_turn(self) -> None:
        """A turn settled: give freed memory back, unless that was done lately."""
        now = time.monotonic()
        if _libc is None or now - self._last < self.every_s:
            return
        self._last = now
        self.trims += 1
        await asyncio.get_running_loop().run_in_executor(None, _libc.malloc_trim, 0)
