"""What a running turn of `AgentLoop` holds (its step, attempt, the stream
in flight, what still plays, the calls not yet dispatched), what it returns,
and the ids it gives tool calls."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from voice.agent.blocks import REASONING, TEXT, Block, BlockAssembler, ToolCall
from voice.agent.preempt import EarlyStart
from voice.agent.surface import Delivered, UnitRef
from voice.log import events as ev


@dataclass
class Streaming:
    ref: UnitRef
    assembler: BlockAssembler
    early: EarlyStart | None = None  # the early start it reads (started before the commit)

    def fields(self) -> dict[str, Any]:
        """What an assistant message or attempt records of the stream
        (besides its route): with an early start, when it began."""
        a = self.assembler
        out = {"message_id": self.ref.message_id, "content": a.content_blocks(), "finish_reason": a.finish_reason,
               "stream": a.timed_stream}
        if (e := self.early) is not None:
            out["early"] = {"words_ms": a.offset_ms(e.words_at),
                            "sent_ms": a.offset_ms(e.sent_at) if e.sent_at is not None else None,
                            "first_text_ms": a.offset_ms(e.first_text_at) if e.first_text_at is not None else None}
        return out


@dataclass
class TurnState:
    turn: int
    step: int = 0
    attempt: int = 0
    step_open: bool = False
    streaming: Streaming | None = None
    # Committed messages whose delivery may still be under way (voice).
    playing: list[UnitRef] = field(default_factory=list)
    pending_calls: list[ToolCall] = field(default_factory=list)  # committed, not dispatched
    held_text: str = ""  # streamed after a write call; waits for its receipt
    dispatching: bool = False  # a dispatched call runs: its receipt is not in yet
    # A stop that lets the dispatched call run to its receipt (the speaker went, the person did
    # not ask to stop): (outcome, reason) of the turn, which ends once the call has its result.
    stop_after_dispatch: tuple[str, str | None] | None = None
    unsaid: list[str] = field(default_factory=list)  # outcome phrases a lost speaker kept: owed once the turn has ended
    # The phrases announcing an outcome (`_release_held`) handed to the surface: owed if the
    # speaker goes before one has fully played.
    outcome_phrases: dict[UnitRef, str] = field(default_factory=dict)
    shrink: int = 1  # the history budget is divided by this (2 after the server said "context length exceeded")
    early: EarlyStart | None = None  # a request started before the turn was committed (voice.agent.preempt)
    asked_again: ev.ApprovalRequested | None = None  # a question a restart left unanswered (voice.agent.approvals)
    asked_again_ago: str = ""  # how long ago it was first asked, in words


@dataclass(frozen=True)
class TurnResult:
    turn: int
    outcome: str  # completed | aborted | interrupted | error


def call_id(ref: UnitRef, index: int) -> str:
    """Our id for the `index`-th tool call of a committed message: unique in
    the log for its whole life, because the turn id is (docs/EVENTS.md), whatever
    ids the provider sends ("call_0" in every request, "skill_1" in every
    process, none at all). Letters, digits and "_" only: providers accept it
    when history goes back to them."""
    return f"call_{ref.turn}_{ref.step}_{ref.attempt}_{index}"


def own_ids(ref: UnitRef, calls: list[ToolCall]) -> list[ToolCall]:
    return [replace(c, id=call_id(ref, n)) for n, c in enumerate(calls)]


def delivered_prefix(blocks: list[Block], delivered: Delivered) -> list[dict[str, Any]]:
    """Keep of each text/reasoning block what the surface delivered."""
    budget = {TEXT: delivered.text_chars, REASONING: delivered.reasoning_chars}
    out = []
    for b in blocks:
        take = min(len(b.text), budget[b.type])
        budget[b.type] -= take
        piece = b.text[:take]
        if piece.strip():
            out.append({"type": b.type, "text": piece})
    return out
