"""Let a stuck PortAudio callback thread be cancelled after all.

PortAudio 19.6's ALSA callback thread (Debian's libportaudio2) turns POSIX
cancellation off for its whole life and on only around its `poll()`; its
stop and abort (`Pa_AbortStream`: `pthread_cancel`, then `pthread_join`)
count on that poll. When the audio server dies under a stream, the thread
can fall into a loop in its error path (PortAudio #1037, fixed after 19.7:
`PA_UNLESS(self->capture.ready || self->playback.ready)` jumping to its own
label) that never polls again: an abort's cancellation stays pending for
ever, and so does the join. The loop does pass a cancellation point on
every turn (the `write()` of its error message to C's `stderr`), so the
thread ends there once its cancellation is turned on: it unwinds as an
aborted PortAudio thread does (its cleanup stops the ALSA handles and calls
the finished callback), the join returns, and the stream closes.

No API turns on another thread's cancellation, so its flag is cleared in
the C library's thread descriptor (what `pthread_t` points at). Where it is
there is found at run time, not assumed: a thread of ours turns its own
cancellation off and on again, and the one bit of its descriptor that
follows is the flag (on Debian 12's glibc 2.36, bit 0 of `cancelhandling`,
776 bytes in). Where no single bit follows (another C library, another
layout), `can_cancel_stuck()` is False and nothing is written.

A lock the thread held when it ended is let go (`release_locks_of`).
#1037's loop has two forms. In one (no xrun) it only prints. In the other
(an xrun) each turn restarts ALSA under the stream's `stateMtx`, and
prints inside that lock as well as outside it. A thread cancelled at a
print inside ends with `stateMtx` held, and closing the stream then fails
PortAudio's assertion that the mutex can be destroyed (SIGABRT in
`PaUnixMutex_Terminate`: once in 82 losses, caught under gdb). So before
the close, a mutex in the stream's memory that the ended thread still
holds is unlocked. A `pthread_mutex_t` keeps its holder's thread id (glibc:
the owner word); where, is found at run time as for the flag.

Only for a thread that has stopped calling back, still runs and spins,
while its stream's abort waits on it (voice.audio.stream_life): a thread in
its callback (in Python) must never be cancelled, nor one blocked in
PortAudio where it holds its stream's lock (PortAudio turns cancellation
off there; cancelled with the lock held, the close then fails an assertion
and aborts the process: seen once in 84 kills when the flag was cleared at
once, before the abort had had its chance). Measured on the tests'
PipeWire with the server killed under a duplex stream: every stuck thread
(the loop: 44-95 % of a core) ended within 40 ms of its flag being
cleared, and PortAudio re-initialised after.
"""

from __future__ import annotations

import ctypes
import threading

_PTHREAD_CANCEL_ENABLE, _PTHREAD_CANCEL_DISABLE = 0, 1
# How much of a thread descriptor is compared (glibc's is 2,368 bytes on x86-64; reading past
# its end could leave the thread's mapping).
_SPAN = 1024
_ROUNDS = 3  # the flag must be the same bit in each of this many off-and-on rounds

_flag: tuple[int, int] | None = None  # (byte offset, bit mask) once found
_looked = False


def _find_flag() -> tuple[int, int] | None:
    """The (offset, mask) of the cancellation-off flag in this C library's
    thread descriptor, or None."""
    try:
        libc = ctypes.CDLL(None)
        set_state = libc.pthread_setcancelstate
    except (OSError, AttributeError):  # no C library to ask, or one without POSIX threads
        return None
    set_state.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    found: list[tuple[int, int] | None] = []

    def probe() -> None:
        descriptor = threading.get_ident()  # pthread_self() on POSIX
        old = ctypes.c_int()
        for _ in range(_ROUNDS):
            on = ctypes.string_at(descriptor, _SPAN)
            set_state(_PTHREAD_CANCEL_DISABLE, ctypes.byref(old))
            off = ctypes.string_at(descriptor, _SPAN)
            set_state(_PTHREAD_CANCEL_ENABLE, ctypes.byref(old))
            again = ctypes.string_at(descriptor, _SPAN)
            words = [i for i in range(0, _SPAN, 4) if on[i:i + 4] != off[i:i + 4] and on[i:i + 4] == again[i:i + 4]]
            if len(words) != 1:
                found.append(None)
                return
            i = words[0]
            bit = int.from_bytes(on[i:i + 4], "little") ^ int.from_bytes(off[i:i + 4], "little")
            set_when_off = int.from_bytes(off[i:i + 4], "little") & bit
            found.append((i, bit) if bit & (bit - 1) == 0 and set_when_off else None)

    thread = threading.Thread(target=probe, name="voice-find-cancel-flag", daemon=True)
    thread.start()
    thread.join()
    return found[0] if len(found) == _ROUNDS and len(set(found)) == 1 else None


def can_cancel_stuck() -> bool:
    """Whether this C library's cancellation flag was found (looked for once)."""
    global _flag, _looked
    if not _looked:
        _flag, _looked = _find_flag(), True
    return _flag is not None


def allow_cancel(descriptor: int) -> bool:
    """Turn on cancellation in the running thread `descriptor` (its
    pthread_t: `threading.get_ident()` in it); a cancellation already asked
    for (an abort's) then ends it at its next cancellation point. The caller
    makes sure the thread still runs. False where it cannot be done."""
    if not can_cancel_stuck():
        return False
    offset, bit = _flag
    word = ctypes.c_int32.from_address(descriptor + offset)
    # The thread itself changes another bit of this word around each system call (glibc's cancellation
    # type) with a compare-and-swap: a store of ours between its read and its swap makes it retry; one of
    # its swaps between our read and our store is undone by it, hence the loop until the flag reads clear.
    for _ in range(100):
        value = word.value
        if not value & bit:
            return True
        word.value = value & ~bit
    return not word.value & bit


# -- the locks an ended thread still held --------------------------------------

_MUTEX_BYTES = 40  # sizeof(pthread_mutex_t) on 64-bit Linux
_mutex_layout: tuple[int, int] | None = None  # (offset of the lock word, offset of the holder's thread id)
_mutex_looked = False


def _find_mutex_layout() -> tuple[int, int] | None:
    """Where a locked pthread_mutex_t keeps its lock word and its holder's
    thread id: a mutex of ours, locked by a thread of ours, read. None when
    no single word holds the thread id, or the library cannot be asked."""
    try:
        libc = ctypes.CDLL(None)
        init, lock, unlock = libc.pthread_mutex_init, libc.pthread_mutex_lock, libc.pthread_mutex_unlock
    except (OSError, AttributeError):
        return None
    mutex = ctypes.create_string_buffer(_MUTEX_BYTES)
    if init(mutex, None) != 0:
        return None
    seen: list[tuple[int, bytes]] = []

    def hold() -> None:
        if lock(mutex) == 0:
            seen.append((threading.get_native_id(), mutex.raw))
            unlock(mutex)

    thread = threading.Thread(target=hold, name="voice-find-mutex-owner", daemon=True)
    thread.start()
    thread.join()
    if not seen:
        return None
    tid, held = seen[0]
    words = [int.from_bytes(held[i:i + 4], "little") for i in range(0, _MUTEX_BYTES, 4)]
    owner = [i * 4 for i, word in enumerate(words) if word == tid]
    if len(owner) != 1 or words[0] == 0 or mutex.raw != bytes(_MUTEX_BYTES):
        return None
    return 0, owner[0]


def release_locks_of(address: int, span: int, thread_ids: set[int]) -> int:
    """Unlock every mutex in the `span` bytes at `address` (a PortAudio
    stream's own memory) that a thread of `thread_ids` still holds. Only
    once those threads have ended (a stuck thread cancelled, and joined by
    its stream's abort) and before the stream is closed: nothing else would
    ever let that mutex go. Returns how many were unlocked."""
    global _mutex_layout, _mutex_looked
    if not _mutex_looked:
        _mutex_layout, _mutex_looked = _find_mutex_layout(), True
    if _mutex_layout is None or not thread_ids or not address:
        return 0
    lock_at, owner_at = _mutex_layout
    memory = ctypes.string_at(address, span + _MUTEX_BYTES)
    unlock = ctypes.CDLL(None).pthread_mutex_unlock
    unlock.argtypes = [ctypes.c_void_p]
    released = 0
    for at in range(0, span, 4):  # (a pthread_mutex_t is aligned to at least 4 bytes)
        owner = int.from_bytes(memory[at + owner_at:at + owner_at + 4], "little")
        if owner in thread_ids and int.from_bytes(memory[at + lock_at:at + lock_at + 4], "little") != 0:
            released += unlock(address + at) == 0
    return released
