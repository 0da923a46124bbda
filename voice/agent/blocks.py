"""BlockAssembler: provider deltas -> ordered content blocks.

A block opens when a delta of a new kind (or a new tool-call index) arrives
and closes when the next block opens or the stream finishes. The assembler
also keeps the exact timed stream (every delta with its offset in ms) so the
log can embed what the provider really sent.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from voice.agent.providers.base import (
    Delta,
    Finish,
    OtherDelta,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)

TEXT = "text"
REASONING = "reasoning"
TOOL_CALL = "tool_call"
KNOWN_CONTENT = (TEXT, REASONING)


@dataclass
class Block:
    type: str  # "text", "reasoning", "tool_call" or a provider's other kind
    text: str = ""  # text/reasoning content, or a tool call's raw arguments
    closed: bool = False
    index: int | None = None  # tool calls: the provider's index
    id: str | None = None
    name: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.type == TOOL_CALL:
            return {"type": TOOL_CALL, "id": self.id, "name": self.name, "arguments": self.text}
        return {"type": self.type, "text": self.text}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments_json: str
    # The id the provider sent, if any. Kept for the record; the loop gives
    # each call an id of its own (docs/EVENTS.md, `tool/call`), so it is not part of equality.
    provider_id: str | None = field(default=None, compare=False)

    def arguments(self) -> dict[str, Any]:
        """Parsed arguments; raises ValueError naming the problem."""
        if not self.arguments_json.strip():
            return {}
        try:
            value = json.loads(self.arguments_json)
        except json.JSONDecodeError as exc:
            raise ValueError(f"arguments of {self.name} are not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise ValueError(f"arguments of {self.name} must be a JSON object, got {type(value).__name__}")
        return value

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_json}}


@dataclass
class BlockAssembler:
    blocks: list[Block] = field(default_factory=list)
    finish_reason: str | None = None
    timed_stream: list[list[Any]] = field(default_factory=list)
    # Read at call time, not bound at import: `voice replay` installs its
    # virtual clock (patching time.monotonic) after this module is imported.
    _started: float = field(default_factory=lambda: time.monotonic())

    def feed(self, delta: Delta) -> None:
        offset_ms = round((time.monotonic() - self._started) * 1000, 1)
        if isinstance(delta, Finish):
            self.timed_stream.append([offset_ms, "finish", delta.reason])
            self.finish_reason = delta.reason
            self.close()
        elif isinstance(delta, TextDelta):
            self.timed_stream.append([offset_ms, TEXT, delta.text])
            self._current(TEXT).text += delta.text
        elif isinstance(delta, ReasoningDelta):
            self.timed_stream.append([offset_ms, REASONING, delta.text])
            self._current(REASONING).text += delta.text
        elif isinstance(delta, ToolCallDelta):
            self.timed_stream.append(
                [offset_ms, TOOL_CALL, {"index": delta.index, "id": delta.id, "name": delta.name, "arguments": delta.arguments}]
            )
            block = self._current_tool_call(delta.index)
            block.id = block.id or delta.id
            block.name = block.name or delta.name
            block.text += delta.arguments
        elif isinstance(delta, OtherDelta):
            self.timed_stream.append([offset_ms, delta.kind, delta.data])
            block = self._current(delta.kind)
            if isinstance(delta.data, str):
                block.text += delta.data
        else:  # pragma: no cover - the Delta union is closed
            raise TypeError(f"not a stream delta: {delta!r}")

    def offset_ms(self, at: float) -> float:
        """A `time.monotonic()` reading as an offset of the timed stream
        (ms from its start; negative: before it)."""
        return round((at - self._started) * 1000, 1)

    def note_error(self, message: str) -> None:
        self.timed_stream.append([round((time.monotonic() - self._started) * 1000, 1), "error", message])

    def _open(self) -> Block | None:
        if self.blocks and not self.blocks[-1].closed:
            return self.blocks[-1]
        return None

    def _current(self, kind: str) -> Block:
        block = self._open()
        if block is not None and block.type == kind:
            return block
        if block is not None:
            block.closed = True
        block = Block(type=kind)
        self.blocks.append(block)
        return block

    def _current_tool_call(self, index: int) -> Block:
        block = self._open()
        if block is not None and block.type == TOOL_CALL and block.index == index:
            return block
        if block is not None:
            block.closed = True
        block = Block(type=TOOL_CALL, index=index)
        self.blocks.append(block)
        return block

    def close(self) -> None:
        block = self._open()
        if block is not None:
            block.closed = True

    # -- views -------------------------------------------------------------

    def interrupted_blocks(self) -> list[Block]:
        """What an interrupted stream may contribute: closed and open text and
        reasoning blocks with non-whitespace content, in stream order. Tool
        calls, empty blocks and blocks of unknown type are left out."""
        return [b for b in self.blocks if b.type in KNOWN_CONTENT and b.text.strip()]

    def text(self) -> str:
        return "".join(b.text for b in self.blocks if b.type == TEXT)

    def tool_calls(self) -> list[ToolCall]:
        calls = []
        for n, b in enumerate(b for b in self.blocks if b.type == TOOL_CALL):
            calls.append(ToolCall(id=b.id or f"call_{n}", name=b.name or "", arguments_json=b.text, provider_id=b.id))
        return calls

    def content_blocks(self) -> list[dict[str, Any]]:
        """The complete message's text and reasoning blocks (non-empty)."""
        return [b.to_json() for b in self.interrupted_blocks()]
