"""add_note / read_notes: a plain-text notes file under the XDG data dir.

One note per line: "YYYY-MM-DD HH:MM:SS<TAB>text" (local time; notes
written before issue #11 have minutes only). The text is one line of
printable characters: control characters (ESC, NUL, ...) and bidirectional
overrides are dropped, so the file shows what was said when printed.

The write is appended with O_APPEND and fsync'd before the receipt is
made; the receipt carries the byte offset, length and SHA-256 of the line.
`reconcile()` reads the file to find out whether an unknown write landed:
a line with the text, stamped at or after the dispatch.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import unicodedata
from pathlib import Path
from typing import Any

import anyio

from voice.agent.tools.base import Receipt, Tool, ToolContext, ToolError, ToolOutcome

NOTES_FILE = "notes.txt"
_STAMP = "%Y-%m-%d %H:%M:%S"
_OLD_STAMP = "%Y-%m-%d %H:%M"  # minute precision, before issue #11
_ESCAPE_SEQUENCE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")  # terminal colours, cursor moves
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _path(ctx: ToolContext) -> Path:
    return ctx.data_dir / NOTES_FILE


def _line(text: str, when: dt.datetime) -> bytes:
    return f"{when.strftime(_STAMP)}\t{text}\n".encode()


def _stamped_at_or_after(stamp: str, since: float) -> bool:
    """Whether a line's stamp is not earlier than `since` (epoch seconds),
    compared at the stamp's own precision."""
    for fmt, unit in ((_STAMP, "seconds"), (_OLD_STAMP, "minutes")):
        try:
            written = dt.datetime.strptime(stamp, fmt)
        except ValueError:
            continue
        start = dt.datetime.fromtimestamp(since)
        start = start.replace(microsecond=0) if unit == "seconds" else start.replace(second=0, microsecond=0)
        return written >= start
    return False


class _NotSynced(Exception):
    """Written, but fsync failed: the note may or may not be on disk."""


def _append_synced(path: Path, line: bytes) -> tuple[int, int]:
    """Append and fsync; returns (offset, bytes written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        offset = os.fstat(fd).st_size
        written = os.write(fd, line)
        try:
            os.fsync(fd)
        except OSError as exc:
            raise _NotSynced(str(exc)) from exc
    finally:
        os.close(fd)
    return offset, written


def _text_arg(args: dict[str, Any]) -> str:
    text = args.get("text")
    if isinstance(text, str):
        text = "".join(" " if ch.isspace() else ch for ch in _ESCAPE_SEQUENCE.sub("", text)
                       if ch.isspace() or (unicodedata.category(ch) not in ("Cc", "Cs") and ch not in _BIDI_CONTROLS))
    if not isinstance(text, str) or not text.strip():
        raise ToolError("add_note needs {\"text\": \"what to write\"}")
    return " ".join(text.split())  # one line per note


async def _add_note(args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
    text = _text_arg(args)
    line = _line(text, dt.datetime.now())
    try:
        offset, written = await anyio.to_thread.run_sync(_append_synced, _path(ctx), line)
    except _NotSynced as exc:
        return ToolOutcome({"saved": "unknown", "error": str(exc)}, Receipt("unknown", {"fsync": str(exc)}))
    except OSError as exc:  # nothing reached the file, or fsync could not promise it did
        return ToolOutcome({"saved": False, "error": str(exc)}, Receipt("failed", {"error": str(exc)}))
    if written != len(line):
        return ToolOutcome({"saved": False}, Receipt("failed", {"written": written, "expected": len(line)}))
    evidence = {"path": str(_path(ctx)), "offset": offset, "length": written,
                "sha256": hashlib.sha256(line).hexdigest()}
    return ToolOutcome({"saved": True, "note": text}, Receipt("confirmed", evidence), phrase="Done, I saved the note.")


async def _reconcile_note(args: dict[str, Any], dispatch: dict[str, Any], ctx: ToolContext) -> Receipt:
    """Confirmed if a line with this text was written at or after the
    dispatch (at the stamp's precision: seconds, or minutes for old lines),
    failed if the file holds none. An older note with the same text is not
    this call's."""
    text = _text_arg(args)
    path = _path(ctx)
    since = dispatch.get("at_wall")
    try:
        data = await anyio.Path(path).read_bytes()
    except FileNotFoundError:
        return Receipt("failed", {"path": str(path), "reason": "no notes file"})
    if not isinstance(since, (int, float)):
        return Receipt("unknown", {"path": str(path), "reason": "the dispatch has no time to compare with"})
    offset = 0
    for raw in data.splitlines(keepends=True):
        stamp, _, body = raw.decode(errors="replace").rstrip("\n").partition("\t")
        if body == text and _stamped_at_or_after(stamp, since):
            return Receipt("confirmed", {"path": str(path), "offset": offset, "length": len(raw),
                                         "sha256": hashlib.sha256(raw).hexdigest(), "written_at": stamp})
        offset += len(raw)
    return Receipt("failed", {"path": str(path), "reason": "no such note written since the dispatch"})


async def _read_notes(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    path = _path(ctx)
    try:
        lines = (await anyio.Path(path).read_text()).splitlines()
    except FileNotFoundError:
        lines = []
    notes = [{"at": s, "text": t} for s, _, t in (ln.partition("\t") for ln in lines) if t]
    limit = int(args.get("limit", 10)) if str(args.get("limit", "10")).isdigit() else 10
    return {"count": len(notes), "notes": notes[-limit:]}


def notes_tools() -> list[Tool]:
    return [
        Tool("add_note", "Save a short note for the person (one line of text).",
             {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
             "write", _add_note, timeout_s=5.0, reconcile=_reconcile_note),
        Tool("read_notes", "Read the person's most recent notes.",
             {"type": "object", "properties": {"limit": {"type": "integer"}}},
             "read", _read_notes, timeout_s=5.0),
    ]
