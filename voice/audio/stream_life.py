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
thread never calls back again and loops for ever in its error path
(PortAudio #1037, fixed upstream after 19.7), printing to stderr; stopping,
aborting or closing such a stream waits for that thread, for ever. So
streams are closed in a thread of their own, for at most `CLOSE_BOUND_S`;
one that does not close is *wedged*: kept referenced (collecting it would
close it, and hang there) and never touched again. PortAudio's device list
is frozen at initialisation, so it is re-initialised before a reopen, but
only while no stream of ours is open: Pa_Terminate closes every open
stream, and would hang on a wedged one. A wedged stream leaves the default
devices as named at start-up ("default" on ALSA, which follows the audio
server's default), which is what a PipeWire or PulseAudio system uses.

A wedged stream's thread goes on looping: it is moved to SCHED_IDLE (it
runs only when nothing else wants the CPU). Only a fixed PortAudio, or
streams in a child process that can be killed, would end it. From the
moment the server dies, before the loss can be known, that thread prints
some 380,000 lines a second to C stdio's `stderr` (50-70 MB a loss into
the journal, measured): so the live device points C stdio's `stderr` at
/dev/null before it opens its first stream (`silence_c_stderr`; file
descriptor 2 stays as it is: Python's own stderr, and so every line of
ours, goes on; what is lost is ALSA's and PortAudio's own chatter, whose
errors reach us as `PortAudioError` anyway).

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

# No callback for this long, and this many block periods: the stream is lost. Not 10 blocks
# alone (320 ms): on 2 loaded cores a live stream went 491 ms without a callback, and came back.
STALL_S = 0.7
STALL_BLOCKS = 10
# A stream just opened may take longer to call back the first time: on the live test's PipeWire, with
# the pipeline starting beside it, 3 s.
FIRST_CALL_S = 5.0
FLAGGED_BLOCKS = 10  # this many flagged callbacks in a row (xruns on every block): lost
CHECK_S = 0.2  # the loop looks at the watch at least this often: a stall is known within 0.9 s
CLOSE_BOUND_S = 1.0  # a stream that has not closed by then is wedged (see above)
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
    threads: set[int] = field(default_factory=set)  # the native ids of the threads that call back
    _opened: float = field(default_factory=time.monotonic)
    _last: dict[str, float] = field(default_factory=dict)
    _flagged: dict[str, int] = field(default_factory=dict)
    _ended: str | None = None

    def __post_init__(self) -> None:
        self._flagged = {role: 0 for role in self.roles}

    def called(self, role: str, status) -> bool:
        """From a callback: it was called, with PortAudio's status flags.
        False once the streams are lost: hand nothing over."""
        self._last[role] = time.monotonic()
        self._flagged[role] = self._flagged[role] + 1 if status else 0
        self.threads.add(threading.get_native_id())
        return self.lost is None

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

    def lose(self, reason: str, heard_to: Callable[[], int]) -> int:
        """Mark the streams lost; returns `heard_to()`, read under the lock,
        so no pull comes between it and the loss."""
        with self.lock:
            self.lost = reason
            return heard_to()


def close_in_thread(streams: list) -> Callable[[], bool]:
    """Stop and close `streams` in a thread of their own; returns how to
    ask whether it has finished. PortAudio errors are ignored: a lost
    stream may be half gone."""

    def close() -> None:
        for s in streams:
            for step in (s.stop, s.close):
                try:
                    step()
                except Exception:  # noqa: BLE001 - a dead stream's own error: it is gone either way
                    pass

    thread = threading.Thread(target=close, name="voice-close-streams", daemon=True)
    thread.start()
    return lambda: not thread.is_alive()


async def close_streams(streams: list, wedged: list, bound_s: float = CLOSE_BOUND_S) -> bool:
    """Stop and close `streams` within `bound_s`, off the event loop; those
    that do not close join `wedged` (kept referenced for ever). True when
    they all closed."""
    if not streams:
        return True
    done = close_in_thread(list(streams))
    with anyio.move_on_after(bound_s):
        while not done():
            await anyio.sleep(0.01)
    if not done():
        wedged.extend(streams)
        return False
    return True


def refresh_portaudio(sd, wedged: list) -> bool:
    """Re-initialise PortAudio so its device list is the system's now.
    Only with no stream of ours open (Pa_Terminate would close a wedged
    one, and hang); returns whether it was done."""
    if wedged:
        return False
    sd._terminate()
    sd._initialize()
    return True


def forget_wedged(sd, streams: list, threads: set[int]) -> None:
    """Leave wedged `streams` (their callbacks ran in `threads`) as they
    are: see the module's docstring."""
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
