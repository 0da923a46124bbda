"""add_note / read_notes: a plain-text notes file under the XDG data dir.

The write is appended with O_APPEND and fsync'd before the receipt is
made; the receipt carries the byte offset, length and SHA-256 of the line.
`reconcile()` reads the file to find out whether an unknown write landed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from pathlib import Path
from typing import Any

import anyio

from voice.agent.tools.base import Receipt, Tool, ToolContext, ToolError, ToolOutcome

NOTES_FILE = "notes.txt"


def _path(ctx: ToolContext) -> Path:
    return ctx.data_dir / NOTES_FILE


def _line(text: str, when: dt.datetime) -> bytes:
    return f"{when:%Y-%m-%d %H:%M}\t{text}\n".encode()


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
    dispatch (minute precision), failed if the file holds none."""
    text = _text_arg(args)
    path = _path(ctx)
    try:
        data = await anyio.Path(path).read_bytes()
    except FileNotFoundError:
        return Receipt("failed", {"path": str(path), "reason": "no notes file"})
    offset = 0
    for raw in data.splitlines(keepends=True):
        stamp, _, body = raw.decode(errors="replace").rstrip("\n").partition("\t")
        if body == text:
            return Receipt("confirmed", {"path": str(path), "offset": offset, "length": len(raw),
                                         "sha256": hashlib.sha256(raw).hexdigest(), "written_at": stamp})
        offset += len(raw)
    return Receipt("failed", {"path": str(path), "reason": "no such note in the file"})


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
