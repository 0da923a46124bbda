"""The playback buffer: what the speaker will play, and what it has played.

A pure state machine shared by the audio callback (which `pull`s exactly the
samples it hands to the device) and the event loop (which `enqueue`s speech
and asks how much of each chunk was heard). A short lock guards it; nothing
in it blocks or allocates much, so it is safe inside an audio callback.

Invariant: `position` counts every sample ever handed to the device, speech
or silence. A chunk's `start` is the position of its first sample, so the
person has heard `position - latency - start` samples of it (clamped).
`clear()` is only *requested* from the loop; the next `pull` performs it, so
the device buffer is emptied in the callback itself and nothing of a cleared
chunk is handed to the device afterwards.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import lru_cache

#: Positions of the newest pauses, resumes, clears and chunk starts kept (a
#: service runs for weeks: diagnostics need the recent ones, not all).
KEEP_MARKS = 256

import numpy as np


_RELEASED = np.zeros(0, np.int16)


@lru_cache(maxsize=8)
def silence(n: int) -> np.ndarray:
    """`n` samples of silence, one read-only array per length: what `pull`
    hands out while nothing plays, so the audio callback of a waiting
    service allocates nothing and can tell silence without measuring it."""
    block = np.zeros(n, np.int16)
    block.setflags(write=False)
    return block


@dataclass
class _Chunk:
    key: Hashable
    samples: np.ndarray  # int16, mono, at the buffer's rate; released once handed over or dropped
    length: int = 0
    start: int | None = None  # device position of the first sample, once handed over
    taken: int = 0  # samples handed to the device so far
    dropped: bool = False
    not_before: int | None = None  # a replayed recording: it starts no sooner than this position

    def release(self) -> None:
        """A service runs for days: keep the bookkeeping, free the audio."""
        self.samples = _RELEASED


class Marks(list):
    """A list of device positions that holds the newest `keep` to `2 * keep`
    of them (None: all, for a finite replay); older ones are dropped in
    batches, so an append stays cheap."""

    def __init__(self, keep: int | None):
        super().__init__()
        self.keep = keep

    def append(self, position: int) -> None:
        super().append(position)
        if self.keep is not None and len(self) > 2 * self.keep:
            del self[: len(self) - self.keep]


@dataclass
class PlaybackBuffer:
    """`keep`: how many of each kind of position mark (`pauses`, `resumes`,
    `clears`, `starts`) are kept, the newest; None keeps all (a finite
    replay reads them afterwards). Chunks are forgotten by their owner
    (`forget`) once their delivery has been read."""

    rate: int
    keep: int | None = KEEP_MARKS
    _queue: deque[_Chunk] = field(default_factory=deque)
    _chunks: dict[Hashable, _Chunk] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _clear_requested: bool = False
    _drop_requested: set = field(default_factory=set)
    _pause_requested: bool | None = None  # True: pause, False: resume, at the next pull
    paused: bool = False
    #: device positions at which output was paused / resumed (barge-in that may be confirmed)
    pauses: Marks = field(init=False)
    resumes: Marks = field(init=False)
    position: int = 0
    #: device positions at which a requested clear was carried out
    clears: Marks = field(init=False)
    #: how many clears were carried out, ever (waiting for the next one)
    clear_count: int = 0
    #: device positions at which a chunk's first sample was handed over
    starts: Marks = field(init=False)
    #: called (from the thread that pulls) after a pull that started or
    #: finished a chunk, or carried out a clear, drop, pause or resume
    _listeners: list = field(default_factory=list)
    #: `on_handed(key, start, end)` after a pull that handed samples of a chunk
    #: over: its span so far (device positions); a replay folds these into the
    #: figures of each turn, since the chunks themselves are forgotten
    on_handed: Callable[[Hashable, int, int], None] | None = None

    def __post_init__(self) -> None:
        self.pauses, self.resumes, self.clears, self.starts = (Marks(self.keep) for _ in range(4))

    def subscribe(self, listener) -> None:
        """`listener()` is called after every pull that changed what plays;
        from the pulling thread (the audio callback), so it must only hand
        the news on (e.g. loop.call_soon_threadsafe)."""
        self._listeners.append(listener)

    def enqueue(self, key: Hashable, samples: np.ndarray, not_before: int | None = None) -> None:
        """Queue a chunk; `not_before`: silence until that position, then
        it (a replayed recording's reply plays where it played then)."""
        if samples.dtype != np.int16 or samples.ndim != 1:
            raise ValueError("playback wants mono int16 samples")
        chunk = _Chunk(key, samples, len(samples), not_before=not_before)
        with self._lock:
            self._chunks[key] = chunk
            self._queue.append(chunk)

    def request_clear(self) -> None:
        """Drop everything not yet handed to the device, at the next pull."""
        with self._lock:
            self._clear_requested = True

    def request_pause(self) -> None:
        """Stop handing speech to the device at the next pull, keeping the
        queue and every chunk's place: resume plays on from the same sample."""
        with self._lock:
            self._pause_requested = True

    def request_resume(self) -> None:
        with self._lock:
            self._pause_requested = False

    def request_drop(self, keys: set[Hashable]) -> None:
        """Drop these chunks (what is not yet handed over), at the next pull."""
        with self._lock:
            self._drop_requested |= set(keys)

    def pull(self, n: int) -> np.ndarray:
        """The next `n` samples for the device: a new array, or while nothing
        is queued or asked for, the shared read-only `silence(n)`."""
        with self._lock:
            if not (self._queue or self._clear_requested or self._drop_requested) and self._pause_requested is None:
                self.position += n  # the service waits: nothing to hand over, nothing changes
                return silence(n)
        out = np.zeros(n, dtype=np.int16)
        changed = False
        handed = []
        with self._lock:
            if self._clear_requested:
                changed = True
                for chunk in self._queue:
                    chunk.dropped = True
                    chunk.release()
                self._queue.clear()
                self._clear_requested = False
                self.clears.append(self.position)
                self.clear_count += 1
            if self._pause_requested is not None:
                changed = changed or self._pause_requested != self.paused
                if self._pause_requested and not self.paused:
                    self.pauses.append(self.position)
                elif not self._pause_requested and self.paused:
                    self.resumes.append(self.position)
                self.paused, self._pause_requested = self._pause_requested, None
            if self._drop_requested:
                changed = True
                for chunk in self._queue:
                    if chunk.key in self._drop_requested:
                        chunk.dropped = True
                        chunk.release()
                self._queue = deque(c for c in self._queue if not c.dropped)
                self._drop_requested = set()
            filled = 0
            while filled < n and self._queue and not self.paused:
                chunk = self._queue[0]
                if chunk.start is None and chunk.not_before is not None and self.position + filled < chunk.not_before:
                    filled = min(n, chunk.not_before - self.position)  # silence until then
                    continue
                if chunk.start is None:
                    chunk.start = self.position + filled
                    self.starts.append(chunk.start)
                    changed = True
                take = min(n - filled, chunk.length - chunk.taken)
                out[filled : filled + take] = chunk.samples[chunk.taken : chunk.taken + take]
                chunk.taken += take
                filled += take
                if take and self.on_handed is not None:
                    handed.append((chunk.key, chunk.start, chunk.start + chunk.taken))
                if chunk.taken == chunk.length:
                    self._queue.popleft()
                    chunk.release()
                    changed = True
            self.position += n
        for key, start, end in handed:
            self.on_handed(key, start, end)
        if changed:
            for listener in self._listeners:
                listener()
        return out

    # -- what was heard ----------------------------------------------------

    def heard(self, key: Hashable, latency: int = 0) -> int:
        """Samples of chunk `key` that have come out of the speaker, given
        the device's output latency in samples."""
        with self._lock:
            chunk = self._chunks.get(key)
            if chunk is None or chunk.start is None:
                return 0
            return max(0, min(chunk.taken, self.position - latency - chunk.start))

    def handed(self, key: Hashable) -> int:
        """Samples of chunk `key` handed to the device (they will play out)."""
        with self._lock:
            chunk = self._chunks.get(key)
            return chunk.taken if chunk is not None else 0

    def span(self, key: Hashable) -> tuple[int, int] | None:
        """Device positions of the chunk's first and last-handed sample."""
        with self._lock:
            chunk = self._chunks.get(key)
            if chunk is None or chunk.start is None:
                return None
            return chunk.start, chunk.start + chunk.taken

    def finished(self, key: Hashable, latency: int = 0) -> bool:
        """Whether the whole chunk has come out of the speaker."""
        with self._lock:
            chunk = self._chunks.get(key)
        return chunk is not None and self.heard(key, latency) == chunk.length

    def pending(self) -> bool:
        """Speech queued or still in the device."""
        with self._lock:
            return bool(self._queue)

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._chunks)

    def forget(self, key: Hashable) -> None:
        """Drop a chunk's bookkeeping (what was heard of it): its owner has
        read what it needed. A chunk still queued is dropped from the queue."""
        with self._lock:
            chunk = self._chunks.pop(key, None)
            if chunk is not None and any(c is chunk for c in self._queue):
                self._drop_requested.add(key)

    def tracked(self) -> int:
        """Chunks whose bookkeeping is held (a test that it stays bounded)."""
        with self._lock:
            return len(self._chunks)
