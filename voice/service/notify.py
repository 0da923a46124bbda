"""systemd's notification protocol (sd_notify), in a few lines of stdlib.

Without NOTIFY_SOCKET (not under systemd) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import anyio


def notify(state: str) -> bool:
    """Send e.g. "READY=1" to systemd. Returns whether it was sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        # Never block the event loop on systemd: if its queue is full, this
        # message is dropped (a missed WATCHDOG=1 is repeated next interval).
        sock.setblocking(False)
        try:
            sock.connect(address)
            sock.send(state.encode())
        except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
            return False
    return True


def watchdog_interval() -> float | None:
    """Half of WatchdogSec, in seconds, when systemd asked for keep-alives."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2e6


async def watchdog(progress: Callable[[], object], interval: float, send: Callable[[str], object] = notify) -> None:
    """Send WATCHDOG=1 every `interval` only while `progress()` moves: a
    stalled pipeline stops the keep-alives, and systemd restarts it."""
    last = progress()
    while True:
        await anyio.sleep(interval)
        now = progress()
        if now != last:
            last = now
            send("WATCHDOG=1")
