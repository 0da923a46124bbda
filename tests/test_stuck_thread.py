"""voice.audio.stuck_thread: the C library's cancellation flag is found,
and clearing it turns a running thread's cancellation back on (what a
PortAudio callback thread stuck in PortAudio #1037's loop needs for its
abort to end it; the whole of that is checked on the tests' PipeWire,
tests/live/test_live_audio_loss.py)."""

from __future__ import annotations

import ctypes
import sys
import threading

import pytest

from voice.audio.stuck_thread import allow_cancel, can_cancel_stuck, release_locks_of

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PortAudio's ALSA thread: Linux")

PTHREAD_CANCEL_ENABLE, PTHREAD_CANCEL_DISABLE = 0, 1


def test_the_flag_is_found_on_this_c_library():
    assert can_cancel_stuck()


def test_a_thread_that_turned_its_cancellation_off_has_it_on_again():
    libc = ctypes.CDLL(None)
    libc.pthread_setcancelstate.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    turned_off, cleared = threading.Event(), threading.Event()
    seen: list[int] = []

    def thread() -> None:
        old = ctypes.c_int()
        libc.pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, ctypes.byref(old))
        turned_off.set()
        cleared.wait(5)
        libc.pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, ctypes.byref(old))  # (no cancellation was asked for)
        seen.append(old.value)
        libc.pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, ctypes.byref(old))

    t = threading.Thread(target=thread)
    t.start()
    assert turned_off.wait(5)
    assert allow_cancel(t.ident)
    cleared.set()
    t.join(5)
    assert seen == [PTHREAD_CANCEL_ENABLE]


def test_a_mutex_an_ended_thread_still_held_is_let_go():
    """A stuck thread cancelled inside PortAudio's `stateMtx` ends holding
    it, and closing its stream then fails PortAudio's assertion (the mutex
    cannot be destroyed: SIGABRT). `release_locks_of` finds such a mutex in
    the stream's memory by its holder's thread id and unlocks it."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.pthread_mutex_init.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    libc.pthread_mutex_lock.argtypes = libc.pthread_mutex_destroy.argtypes = [ctypes.c_void_p]
    size, at = 1024, 360  # a stream's memory, and where in it its mutex is
    memory = libc.malloc(size)
    ctypes.memset(memory, 0, size)
    assert libc.pthread_mutex_init(memory + at, None) == 0
    ended: list[int] = []

    def lock_and_end() -> None:
        libc.pthread_mutex_lock(memory + at)
        ended.append(threading.get_native_id())

    t = threading.Thread(target=lock_and_end)
    t.start()
    t.join(5)
    try:
        assert libc.pthread_mutex_destroy(memory + at) == 16  # EBUSY: PortAudio would assert here
        assert release_locks_of(memory, size - 40, {ended[0] + 1}) == 0, "only the ended thread's"
        assert release_locks_of(memory, size - 40, set(ended)) == 1
        assert libc.pthread_mutex_destroy(memory + at) == 0
    finally:
        libc.free(memory)
