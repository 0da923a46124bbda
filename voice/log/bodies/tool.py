"""The bodies of tool calls and their effects: the call, its dispatch, its
one result, what is known of a write, the question asked first, timers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from voice.log.bodies.base import UNSET, Body, optional

# tool/result statuses
ABORTED_BEFORE_DISPATCH: Final = "ABORTED_BEFORE_DISPATCH"
BLOCKED: Final = "blocked"  # would repeat a write whose outcome is unknown
DECLINED: Final = "declined"  # the person was asked first and did not say yes

# effect/receipt: `state` confirmed | failed | unknown; `phase` "dispatch" (the
# call's own outcome) or "reconciled" (looked up later). One of each per call.
CONFIRMED: Final = "confirmed"
FAILED: Final = "failed"
UNKNOWN: Final = "unknown"


@dataclass(frozen=True, kw_only=True)
class ToolCalled(Body):
    """A call the model made, with the id this program gave it."""

    TYPE = "tool/call"
    tool_call_id: str
    name: str = ""
    arguments: str = ""  # the JSON text as the model streamed it
    provider_id: str | None = None  # the id the provider sent, if any


@dataclass(frozen=True, kw_only=True)
class ToolDispatched(Body):
    """The moment a call's effect may start."""

    TYPE = "tool/dispatch"
    DURABLE = True
    tool_call_id: str
    name: str = ""
    effect: str | None = None  # read | write
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ToolResult(Body):
    """What a call produced, as the model will see it (`status` ok, error,
    cancelled, blocked, ABORTED_BEFORE_DISPATCH; `receipt` for a write)."""

    TYPE = "tool/result"
    SURFACE = True
    tool_call_id: str
    name: str = ""
    status: str = ""
    content: Any = optional()  # ok: what the tool returned (JSON)
    error: str | None = optional()
    receipt: str | None = optional()  # a dispatched write: confirmed | failed | unknown
    phrase: str | None = optional()  # ok: the tool's own confirmation, spoken only once confirmed
    blocked_by: str | None = optional()  # blocked: the earlier call it would have repeated,
    blocked_turn: int | None = optional()  # its turn,
    blocked_outcome: str | None = optional()  # and what is known of it: confirmed | unknown
    recovered: bool = optional(False)  # written by start-up recovery

    @classmethod
    def ok(cls, call_id: str, name: str, content: Any, receipt: str | None, phrase: str | None) -> ToolResult:
        return cls(tool_call_id=call_id, name=name, status="ok", content=content, receipt=receipt, phrase=phrase)

    @classmethod
    def failed(cls, call_id: str, name: str, error: str, receipt: str | None = UNSET) -> ToolResult:
        """It did not run as asked (no such tool, bad arguments, refused,
        timed out, raised); `receipt`, once it ran past its timeout or
        raised: what is known of a write's effect (None for a read)."""
        return cls(tool_call_id=call_id, name=name, status="error", error=error, receipt=receipt)

    @classmethod
    def stopped(cls, call_id: str, name: str, receipt: str | None) -> ToolResult:
        """The turn was stopped while the call ran: a write's effect is unknown."""
        return cls(tool_call_id=call_id, name=name, status="cancelled", error="the turn was stopped",
                   receipt=receipt)

    @classmethod
    def not_dispatched(cls, call_id: str, name: str) -> ToolResult:
        """The turn ended (a stop, a shutdown, a crash) before the call ran."""
        return cls(tool_call_id=call_id, name=name, status=ABORTED_BEFORE_DISPATCH,
                   error="the turn was stopped before this call ran")

    @classmethod
    def blocked(cls, call_id: str, name: str, *, earlier: str, blocked_by: str, blocked_turn: int | None,
                this_turn: int) -> ToolResult:
        """Not run: it would repeat the write `blocked_by`, whose outcome is
        unknown, or which did happen (`earlier` confirmed) in a turn that
        was cut short before the person heard so."""
        if earlier == CONFIRMED:
            when = ("earlier in this turn" if blocked_turn == this_turn else
                    f"(turn {blocked_turn}), but that turn was cut short before the person heard so")
            why = (f"an earlier {name} with these arguments did happen {when}; it was not repeated. Tell "
                   "the person it was already done.")
        else:
            why = (f"an earlier {name} with these arguments (turn {blocked_turn}) has an unknown outcome; it "
                   "was not repeated. Tell the person it may or may not have happened.")
        return cls(tool_call_id=call_id, name=name, status=BLOCKED, error=why, blocked_by=blocked_by,
                   blocked_turn=blocked_turn, blocked_outcome=earlier)

    @classmethod
    def declined(cls, call_id: str, name: str, how: str, words: str) -> ToolResult:
        """Not run: the person was asked and did not say yes."""
        said = f" (they said: {words.strip().rstrip('.')!r})" if words else ""
        why = {"timeout": "the person did not answer in time", "unavailable": "no one could be asked here",
               "stopped": "the person stopped the assistant"}.get(how, "the person declined")
        return cls(tool_call_id=call_id, name=name, status=DECLINED,
                   error=f"not run: {why}{said}. Do not try it again unless they ask.")

    @classmethod
    def recovered_after_crash(cls, call_id: str, name: str, receipt: str | None) -> ToolResult:
        """A dispatched call the process died during: what its dispatch
        receipt proves, never more. A confirmed write is reported as done
        (the model must not be told it was cancelled, or it may do it again)."""
        base = {"tool_call_id": call_id, "name": name, "receipt": receipt, "recovered": True}
        if receipt == CONFIRMED:
            return cls(**base, status="ok", content={
                "done": True, "note": "its receipt confirms it happened; the assistant stopped before it read the output"})
        if receipt == FAILED:
            return cls(**base, status="error",
                       error="its receipt says it failed; the assistant stopped before it read the output")
        if receipt == UNKNOWN:
            return cls(**base, status="cancelled",
                       error="the assistant stopped before this call finished; it may or may not have happened")
        return cls(**base, status="cancelled", error="the assistant stopped before this call finished")


@dataclass(frozen=True, kw_only=True)
class EffectReceipt(Body):
    """What is known of a write: its own outcome (`phase` "dispatch") or
    what a later look found (`phase` "reconciled"). One of each per call."""

    TYPE = "effect/receipt"
    DURABLE = True
    tool_call_id: str
    name: str = ""
    phase: str = "dispatch"  # (rows before reconciliation existed have none)
    state: str  # confirmed | failed | unknown
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ApprovalRequested(Body):
    """The person is asked before a call is dispatched (voice.agent.approvals)."""

    TYPE = "approval/requested"
    DURABLE = True
    approval_id: str  # the call's tool_call_id
    tool: str  # the name the model used
    server: str = ""  # the MCP server it belongs to
    title: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    question: str = ""
    asked_again: str | None = optional()  # the approval a restart left unanswered, asked here again


@dataclass(frozen=True, kw_only=True)
class ApprovalAnswered(Body):
    """What became of an approval: granted (the call may be dispatched),
    denied, or withdrawn (a barge-in, a stop, a shutdown: never answered)."""

    TYPE = "approval/answered"
    DURABLE = True
    approval_id: str
    decision: str  # granted | denied | withdrawn
    how: str  # voice | text | ctl | always | timeout | unavailable | stopped | restart
    words: str = ""
    always: bool = False


@dataclass(frozen=True, kw_only=True)
class TimerSet(Body):
    TYPE = "timer/set"
    DURABLE = True
    timer_id: str
    label: str = ""
    seconds: int
    due_wall: float
    tool_call_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class TimerCancel(Body):
    TYPE = "timer/cancel"
    DURABLE = True
    timer_id: str


@dataclass(frozen=True, kw_only=True)
class TimerFired(Body):
    TYPE = "timer/fired"
    DURABLE = True
    timer_id: str
    late: bool = False  # it came due while the assistant was not running
    at_wall: float | None = None
    text: str = ""
