"""The life of the live device's PortAudio streams: told lost, closed
within a bound, PortAudio re-initialised, reopened with back-off.

A laptop's audio comes and goes (the audio server restarts, a headset is
unplugged). A stream is *lost* when it stops calling back for `STALL_S`
(and at least `STALL_BLOCKS` blocks; `FIRST_CALL_S` for its first call),
ends on its own (PortAudio's finished callback: an
error, or our callback raised), or flags every one of `FLAGGED_BLOCKS`
blocks in a row (an xrun now and then is not a loss). The callbacks stamp
a `StreamWatch`; the event loop reads it after every mic block and every
`CHECK_S` without one (not every block period: while the service waits,
silence comes once a second, and the loop should wake as seldom).

Measured on PipeWire with PortAudio 19.6 (Debian 12's libportaudio2): when
the server dies under a duplex or output stream, PortAudio's ALSA callback
thread may never call back again and loop for ever in its error path
(PortAudio #1037, fixed upstream after 19.7), printing to stderr; stopping,
aborting or closing such a stream waits for that thread, for ever. So
streams are aborted and closed in a thread of their own, for at most
`CLOSE_BOUND_S`; a callback thread that has not called back meanwhile,
still runs and spins (it ran on a CPU for `SPIN_MIN_S` of `SPIN_WINDOW_S`)
is stuck in that loop: its POSIX cancellation, which PortAudio keeps off,
is turned on (voice.audio.stuck_thread), so the abort's pending
cancellation ends it, and the close goes on (measured: within 40 ms). One
that does not spin is left alone: blocked, it may hold its stream's lock
(PortAudio turns cancellation off while it does), and cancelled there it
would make the close abort the process.
PortAudio's device list is frozen at initialisation, so it is
re-initialised before a reopen, but only while no stream of ours is open:
Pa_Terminate closes every open stream, and would hang on a wedged one.

A stream that still does not close within another `CLOSE_BOUND_S` (a C
library whose cancellation flag was not found, or a thread stuck
elsewhere) is *wedged*, the last resort: kept referenced (collecting it
would close it, and hang there), never touched again, its thread moved to
SCHED_IDLE (it runs only when nothing else wants the CPU), and PortAudio no
longer re-initialised: the default devices stay as named at start-up
("default" on ALSA, which follows the audio server's default).

From the moment the server dies, before the loss can be known, a stuck
thread prints some 380,000 lines a second to C stdio's `stderr` (50-70 MB
a loss into the journal, measured): so the live device points C stdio's
`stderr` at /dev/null before it opens its first stream
(`silence_c_stderr`; file descriptor 2 stays as it is: Python's own
stderr, and so every line of ours, goes on; what is lost is ALSA's and
PortAudio's own chatter, whose errors reach us as `PortAudioError` anyway).
Its `write()` to /dev/null is also the cancellation point where it ends.

While it waits between tries, the audio server's sockets are watched: a
server that (re)appears is tried at once and the back-off starts again from
its first step, so the service listens within a second or two of the
server's arrival, however long it was away.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from voice.audio.stuck_thread import allow_cancel, release_locks_of

# No callback for this long, and this many block periods: the stream is lost. Not 10 blocks
# alone (320 ms): on 2 loaded cores a live stream went 491 ms without a callback, and came back.
STALL_S = 0.7
STALL_BLOCKS = 10
# A stream just opened may take longer to call back the first time: on the live test's PipeWire, with
# the pipeline starting beside it, 3 s.
FIRST_CALL_S = 5.0
FLAGGED_BLOCKS = 10  # this many flagged callbacks in a row (xruns on every block): lost
CHECK_S = 0.2  # the loop looks at the watch at least this often: a stall is known within 0.9 s
CLOSE_BOUND_S = 1.0  # a stream that has not closed by then is stuck, and by twice that wedged (see above)
# A stuck callback thread is let be cancelled only if it ran this much in this window: it spins in
# PortAudio #1037's loop (57-95 % of a core, measured), not blocked where it holds a lock.
SPIN_WINDOW_S = 0.1
SPIN_MIN_S = 0.002
BACKOFF_FIRST_S = 0.2  # the first retry after a loss; each failed one doubles it,
BACKOFF_MAX_S = 5.0  # up to this, for as long as it takes
SOCKET_CHECK_S = 0.1  # while waiting, the audio server's sockets are looked at this often (a stat each)
DEVICES_CHECK_S = 1.0  # with a device pinned, the system's sound devices are looked at this often (a few stats)


@dataclass
class Backoff:
    first_s: float = BACKOFF_FIRST_S
    max_s: float = BACKOFF_MAX_S
    _next: float = 0.0

    def next(self) -> float:
        """The wait before the next try."""
        wait = self._next or self.first_s
        self._next = min(self.max_s, wait * 2)
        return wait


@dataclass
class StreamWatch:
    """What the callbacks of one opening of the streams tell the event loop.
    `lock` is held by an output callback while it pulls from the playback
    buffer and by `lose`: once lost, nothing more is pulled, so the speaker
    position stands where the sound stopped."""

    block_s: float
    roles: tuple[str, ...]  # "input" and "output" (voice.audio.live): each must keep calling
    lock: threading.Lock = field(default_factory=threading.Lock)
    lost: str | None = None
    closing: bool = False  # we are stopping them: their ending is ours
    cancelled: int = 0  # callback threads stuck in PortAudio #1037's loop, let be cancelled as they were closed
    cancelled_ids: set[int] = field(default_factory=set)  # their native ids
    locks_released: int = 0  # mutexes such a thread still held as it ended, let go before the close
    # Each role's callback thread: (native id, pthread_t), to end it when stuck (voice.audio.stuck_thread)
    threads: dict[str, tuple[int, int]] = field(default_factory=dict)
    _opened: float = field(default_factory=time.monotonic)
    _last: dict[str, float] = field(default_factory=dict)
    _returned: dict[str, float] = field(default_factory=dict)
    _flagged: dict[str, int] = field(default_factory=dict)
    _ended: str | None = None

    def __post_init__(self) -> None:
        self._flagged = {role: 0 for role in self.roles}

    def called(self, role: str, status) -> bool:
        """From a callback: it was called, with PortAudio's status flags.
        False once the streams are lost: hand nothing over."""
        self._last[role] = time.monotonic()
        self._flagged[role] = self._flagged[role] + 1 if status else 0
        self.threads[role] = (threading.get_native_id(), threading.get_ident())
        return self.lost is None

    def returned(self, role: str) -> None:
        """From a callback, as it returns (whatever happened in it)."""
        self._returned[role] = time.monotonic()

    def ended(self) -> None:
        """PortAudio's finished callback: a stream stopped on its own."""
        if not self.closing:
            self._ended = "the stream ended on its own"

    def check(self, now: float) -> tuple[str, float] | None:
        """(why the streams are lost, when the sound stopped) or None."""
        if self._ended is not None:
            return self._ended, now
        for role in self.roles:
            last = self._last.get(role)
            if last is None:
                if now - self._opened > FIRST_CALL_S:
                    return f"the {role} stream never called back ({now - self._opened:.1f} s)", self._opened
                continue
            if now - last > max(STALL_S, STALL_BLOCKS * self.block_s):
                # the sound is the speaker's: it stopped at the output's last call (a mic that stalls
                # alone leaves the speaker playing until now)
                return f"the {role} stream stopped calling back ({(now - last) * 1000:.0f} ms)", \
                    self._last.get("output", last)
            if self._flagged[role] >= FLAGGED_BLOCKS:
                # the rule met, not the count by the time the loop looked (one more block may have come):
                # the same words however busy the machine is
                return f"the {role} stream reported errors on {FLAGGED_BLOCKS} blocks in a row", now
        return None

    def stuck_threads(self, now: float, quiet_s: float) -> list[tuple[int, int]]:
        """The callback threads that still run but have not called back for
        `quiet_s`: (native id, pthread_t) each. Never one inside a callback
        (Python must not be cancelled)."""
        return [thread for role, thread in self.threads.items()
                if self._returned.get(role, -1.0) >= self._last[role] and now - self._last[role] >= quiet_s
                and os.path.exists(f"/proc/self/task/{thread[0]}")]

    def lose(self, reason: str, heard_to: Callable[[], int]) -> int:
        """Mark the streams lost; returns `heard_to()`, read under the lock,
        so no pull comes between it and the loss."""
        with self.lock:
            self.lost = reason
            return heard_to()


def close_in_thread(streams: list, watch: StreamWatch | None = None) -> Callable[[], bool]:
    """Abort and close `streams` in a thread of their own; returns how to
    ask whether it has finished. PortAudio errors are ignored: a lost
    stream may be half gone. Between a stream's abort and its close, a
    lock that a callback thread of `watch` let be cancelled still held is
    let go (voice.audio.stuck_thread: else the close aborts the process)."""

    def close() -> None:
        for s in streams:
            # abort, not stop: it cancels the callback thread (voice.audio.stuck_thread), and nothing
            # buffered is worth playing out
            for step in (s.abort, lambda: _release_locks(s, watch), s.close):
                try:
                    step()
                except Exception:  # noqa: BLE001 - a dead stream's own error: it is gone either way
                    pass

    thread = threading.Thread(target=close, name="voice-close-streams", daemon=True)
    thread.start()
    return lambda: not thread.is_alive()


async def close_streams(streams: list, wedged: list, watch: StreamWatch | None = None,
                        bound_s: float = CLOSE_BOUND_S) -> bool:
    """Abort and close `streams` within `bound_s`, off the event loop. A
    callback thread of `watch` stuck in PortAudio #1037's loop is then let
    be cancelled (voice.audio.stuck_thread), for another `bound_s`; those
    that still do not close join `wedged` (kept referenced for ever). True
    when they all closed."""
    if not streams:
        return True
    done = close_in_thread(list(streams), watch)
    if not await _finished_within(done, bound_s) and watch is not None:
        stuck = await spinning(watch.stuck_threads(time.monotonic(), bound_s))
        if not done():  # (a thread the close has joined meanwhile has no descriptor any more)
            watch.cancelled_ids.update(native_id for native_id, _descriptor in stuck)  # (before any can end)
            watch.cancelled = sum(allow_cancel(descriptor) for _native_id, descriptor in stuck)
        if watch.cancelled:
            await _finished_within(done, bound_s)
    if not done():
        wedged.extend(streams)
        return False
    return True


async def spinning(threads: list[tuple[int, int]], window_s: float = SPIN_WINDOW_S) -> list[tuple[int, int]]:
    """Those of `threads` (native id, pthread_t) that ran on a CPU for at
    least `SPIN_MIN_S` in `window_s`: looping, not blocked. PortAudio #1037's
    loop spins; a thread blocked in PortAudio may hold its stream's lock
    (with cancellation off), and cancelled there it would leave the lock
    held: closing the stream then aborts the process (an assertion)."""
    if not threads:
        return []
    before = {native: _cpu_ns(native) for native, _ in threads}
    await anyio.sleep(window_s)
    return [(native, descriptor) for native, descriptor in threads
            if before[native] is not None and (now := _cpu_ns(native)) is not None
            and now - before[native] >= SPIN_MIN_S * 1e9]


def _release_locks(stream, watch: StreamWatch | None) -> None:
    """After `stream`'s abort: the mutexes in its PortAudio memory that a
    cancelled callback thread of `watch` still held, unlocked."""
    if watch is None or not watch.cancelled_ids:
        return
    address = _stream_address(stream)
    if address:
        usable = ctypes.CDLL(None).malloc_usable_size  # (PortAudio mallocs its stream: this is its size)
        usable.restype, usable.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
        watch.locks_released += release_locks_of(address, usable(address), watch.cancelled_ids)


def _stream_address(stream) -> int:
    """The PaStream* behind a sounddevice stream; 0 for anything else."""
    pointer = getattr(stream, "_ptr", None)
    if pointer is None:
        return 0
    try:
        from sounddevice import _ffi
    except ImportError:
        return 0
    return int(_ffi.cast("uintptr_t", pointer))


def _cpu_ns(native_id: int) -> int | None:
    """The time thread `native_id` of this process has run on a CPU, in ns (None: it has ended)."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


async def _finished_within(done: Callable[[], bool], seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        while not done():
            await anyio.sleep(0.01)
    return done()


def refresh_portaudio(sd, wedged: list) -> bool:
    """Re-initialise PortAudio so its device list is the system's now.
    Only with no stream of ours open (Pa_Terminate would close a wedged
    one, and hang); returns whether it was done."""
    if wedged:
        return False
    sd._terminate()
    sd._initialize()
    return True


def forget_wedged(sd, streams: list, threads: list[int]) -> None:
    """Leave wedged `streams` (their callbacks ran in the threads of these
    native ids) as they are: see the module's docstring."""
    # sounddevice's exit handler stops the newest stream and terminates PortAudio:
    # with a wedged stream both would hang the process at exit.
    last = getattr(sd, "_last_callback", None)
    if last is not None and getattr(last, "stream", None) in streams:
        sd._last_callback = None
    sd._initialized = 0
    for tid in threads:
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except OSError:  # it has ended after all
            pass
    silence_c_stderr()


_c_stderr_silenced = False


def silence_c_stderr() -> None:
    """Point C stdio's `stderr` at /dev/null, once (fd 2 is left alone)."""
    global _c_stderr_silenced
    if _c_stderr_silenced:
        return
    libc = ctypes.CDLL(None)
    libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
    null = libc.fopen(os.devnull.encode(), b"w")
    if null:
        ctypes.c_void_p.in_dll(libc, "stderr").value = null
        _c_stderr_silenced = True


def audio_server_sockets() -> tuple:
    """What the audio server's sockets are now (PipeWire's and PulseAudio's,
    in XDG_RUNTIME_DIR): one (inode, change time) or None each. A server
    that starts, or starts again, makes new ones."""
    run = os.environ.get("XDG_RUNTIME_DIR")
    if not run:
        return ()
    found = []
    for path in (os.path.join(run, "pipewire-0"), os.path.join(run, "pulse", "native")):
        try:
            st = os.stat(path)
        except OSError:
            found.append(None)
        else:
            found.append((st.st_ino, st.st_ctime_ns))
    return tuple(found)


async def server_changed_within(seconds: float, before: tuple) -> bool:
    """Wait `seconds` (the back-off), ended early when the audio server's
    sockets change from `before`: True then. A new server is tried at once,
    not up to `BACKOFF_MAX_S` later."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        await anyio.sleep(min(SOCKET_CHECK_S, left))
        if audio_server_sockets() != before:
            return True
    return False


def sound_devices() -> tuple:
    """What the system's sound devices are now, as far as PortAudio's ALSA
    list can change, in a few stats (no re-initialisation, which would need
    our streams closed): the ALSA device nodes (a USB card plugged in or out)
    and ALSA's configuration (a device defined there). A change is worth a
    look at PortAudio's list: a pinned device may have gone or come back."""
    found: list = []
    try:
        found.append(tuple(sorted(os.listdir("/dev/snd"))))
    except OSError:
        found.append(None)
    home = os.path.expanduser("~")
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    for path in ("/etc/asound.conf", "/etc/alsa/conf.d", "/usr/share/alsa/alsa.conf.d", os.path.join(home, ".asoundrc"),
                 os.path.join(config, "alsa", "asoundrc")):
        try:
            st = os.stat(path)
        except OSError:
            found.append(None)
        else:
            found.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(found)
