"""What SQLite's WAL recovery would throw away, found before SQLite does it.

When the first connection opens a log whose write-ahead log (`-wal`) was not
checkpointed (the process was killed, the machine crashed), SQLite keeps the
frames up to the last commit frame that has the header's salts and a valid
running checksum, and silently ignores the rest. After a kill -9 the rest is
at most one unfinished transaction: nothing is lost. Anything else means the
file was damaged, and committed events would vanish without a word:

- a header that is not a WAL header (zeroed, overwritten): every frame is
  ignored, and the log may open as a fresh, empty one;
- a frame that fails its checksum (a flipped bit): it and every later frame
  are ignored, committed transactions among them;
- a file that ends inside a frame (cut short);
- fewer frames than the `-shm` index says were committed (cut at a frame
  boundary; only detectable while the `-shm` of the crashed run is there).

Frames written before the last checkpoint (other salts) are stale by design
and never count as loss. Format: https://www.sqlite.org/fileformat.html#the_write_ahead_log
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path

_HEADER = 32
_FRAME_HEADER = 24
_MAGIC = (0x377F0682, 0x377F0683)  # the last bit: checksums in big-endian words


@dataclass(frozen=True)
class WalDamage:
    """What recovery would drop, in words, and how many commits it holds."""

    reason: str
    lost_commits: int


def _checksum(data: bytes, s0: int, s1: int, big_endian: bool) -> tuple[int, int]:
    words = array("I")
    words.frombytes(data)
    if big_endian != (sys.byteorder == "big"):
        words.byteswap()
    it = iter(words)
    for x0 in it:
        x1 = next(it)
        s0 = (s0 + x0 + s1) & 0xFFFFFFFF
        s1 = (s1 + x1 + s0) & 0xFFFFFFFF
    return s0, s1


def _committed_frames_in_shm(shm: Path, salts: bytes) -> int | None:
    """mxFrame from the wal-index header the crashed run left, if it is
    intact and belongs to this WAL (same salts)."""
    try:
        with open(shm, "rb") as f:
            raw = f.read(96)
    except OSError:
        return None
    if len(raw) < 96 or raw[:48] != raw[48:96]:
        return None
    # WalIndexHdr (native byte order): iVersion, unused, iChange (u32), isInit, bigEndCksum (u8),
    # szPage (u16), mxFrame, nPage, aFrameCksum[2] (u32), then aSalt[2] as the WAL header's bytes.
    is_init, mx_frame = raw[12], struct.unpack_from("=I", raw, 16)[0]
    if not is_init or raw[32:40] != salts:
        return None
    return mx_frame


def find_damage(db: Path) -> WalDamage | None:
    """Read `db`-wal as SQLite's recovery will; None when nothing committed
    would be lost. Call only when no connection has the log open (then the
    WAL is not being written while it is read)."""
    wal = Path(f"{db}-wal")
    try:
        data = wal.read_bytes()
    except FileNotFoundError:
        return None
    if not data:
        return None
    if len(data) < _HEADER:
        return WalDamage(f"its write-ahead log {wal} is cut short ({len(data)} bytes, not even a header)", 1)
    magic, _version, page_size, _ckpt, salt1, salt2, ck1, ck2 = struct.unpack(">8I", data[:_HEADER])
    big = magic == _MAGIC[1]
    valid_page = 512 <= page_size <= 65536 and page_size & (page_size - 1) == 0
    if magic not in _MAGIC or not valid_page or _checksum(data[:24], 0, 0, big) != (ck1, ck2):
        if len(data) == _HEADER:
            return None  # a header alone holds nothing
        return WalDamage(f"the header of its write-ahead log {wal} is unreadable, so all of it "
                         f"({len(data)} bytes) would be ignored", 1)
    frame_size = _FRAME_HEADER + page_size
    frames = (len(data) - _HEADER) // frame_size

    def header(n: int) -> tuple[int, ...]:  # page, commit size (0: not a commit), salt1, salt2, ck1, ck2
        return struct.unpack_from(">6I", data, _HEADER + n * frame_size)

    # This WAL's generation: the leading frames with the header's salts
    # (later ones were written before the last checkpoint: stale).
    current = next((n for n in range(frames) if header(n)[2:4] != (salt1, salt2)), frames)
    # What recovery keeps: up to the last commit before the first bad checksum.
    s0, s1, kept, broken_at = ck1, ck2, 0, None
    for n in range(current):
        at = _HEADER + n * frame_size
        s0, s1 = _checksum(data[at:at + 8], s0, s1, big)
        s0, s1 = _checksum(data[at + _FRAME_HEADER:at + frame_size], s0, s1, big)
        if (s0, s1) != header(n)[4:6]:
            broken_at = n
            break
        if header(n)[1]:
            kept = n + 1
    lost = sum(1 for n in range(kept, current) if header(n)[1])
    if lost and broken_at is not None:
        return WalDamage(f"frame {broken_at + 1} of its write-ahead log {wal} fails its checksum, so "
                         f"{lost} committed transaction(s) from there on would be ignored", lost)
    recorded = _committed_frames_in_shm(Path(f"{db}-shm"), data[16:24])
    if recorded is not None and recorded > kept:
        return WalDamage(f"its write-ahead log {wal} holds {kept} of the {recorded} frames its index says were "
                         "committed (cut short)", recorded - kept)
    tail = data[_HEADER + frames * frame_size:]
    if tail and current == frames and (len(tail) < 16 or struct.unpack_from(">2I", tail, 8) == (salt1, salt2)):
        return WalDamage(f"its write-ahead log {wal} ends inside a frame (cut short), so its last "
                         "transaction would be ignored", max(lost, 1))
    return None


def in_use(db: Path) -> bool:
    """True when some connection (any process, this one too) holds the log
    open: SQLite keeps a lock on the database file while connected in WAL
    mode. Read from /proc/locks, so no descriptor of ours is opened on the
    file (closing one would drop this process's own SQLite locks)."""
    try:
        st = db.stat()
        locks = Path("/proc/locks").read_text()
    except OSError:
        return True  # cannot tell: assume a live writer and leave its WAL alone
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(line.split()[5 if "->" not in line else 6] == dev for line in locks.splitlines() if line.strip())
