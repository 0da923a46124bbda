"""Dispatched writes and what is known of them, derived from the log.

An effect's state is its dispatch receipt (confirmed / failed / unknown), or
"reconciled" once `reconcile()` found out what an unknown write did (then
`outcome` says which). A write with no receipt at all (the process died in
between) is unknown. A call is named by (conversation, turn, step, id): logs
written before ids were minted from the log reuse ids across turns, and one
call must never borrow another's receipt.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from voice.agent.tools.base import Tool, ToolContext
from voice.log import events as ev
from voice.log.store import EventStore


@dataclass(frozen=True)
class Effect:
    conversation: str
    turn: int
    step: int | None
    attempt: int | None
    tool_call_id: str
    tool: str
    arguments: dict[str, Any]
    dispatch: dict[str, Any]  # the dispatch's payload, with `at_wall`: when it was logged
    state: str  # confirmed | failed | unknown | reconciled
    outcome: str  # confirmed | failed | unknown: what is known of the effect now
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": self.arguments, "state": self.state, "turn": self.turn,
                "outcome": self.outcome, "conversation": self.conversation, "tool_call_id": self.tool_call_id,
                "evidence": self.evidence}


def effects(store: EventStore, conversation: str | None = None) -> list[Effect]:
    events = store.events(conversation, types={ev.TOOL_DISPATCH, ev.EFFECT_RECEIPT})
    receipts: dict[tuple[str, int | None, int | None, str, str], ev.EffectReceipt] = {}
    for e in events:
        if isinstance(receipt := e.body, ev.EffectReceipt):
            receipts.setdefault((e.conversation, e.turn, e.step, receipt.tool_call_id, receipt.phase), receipt)
    out = []
    for e in events:
        dispatch = e.body
        if not isinstance(dispatch, ev.ToolDispatched) or dispatch.effect != "write":
            continue
        key = (e.conversation, e.turn, e.step, dispatch.tool_call_id)
        own = receipts.get((*key, "dispatch"))
        reconciled = receipts.get((*key, "reconciled"))
        if reconciled is not None:
            state, outcome, evidence = "reconciled", reconciled.state, reconciled.evidence
        elif own is not None:
            state = outcome = own.state
            evidence = own.evidence
        else:
            state = outcome = ev.UNKNOWN
            evidence = {"reason": "no receipt was recorded"}
        out.append(Effect(e.conversation, e.turn, e.step, e.attempt, dispatch.tool_call_id, dispatch.name,
                          dispatch.arguments, {**e.payload, "at_wall": e.at_wall}, state, outcome, evidence))
    return out


def record_receipt(store: EventStore, conversation: str, call_id: str, name: str, phase: str, state: str,
                   evidence: dict[str, Any], *, turn: int | None, step: int | None, attempt: int | None) -> None:
    """The one writer of `effect/receipt`: what is known of a write, from
    its own outcome (`phase` "dispatch": the loop, or recovery for a call a
    crash cut) or from a later look (`phase` "reconciled")."""
    store.record(conversation, ev.EffectReceipt(tool_call_id=call_id, name=name, phase=phase, state=state,
                                                evidence=evidence), turn=turn, step=step, attempt=attempt)


async def reconcile_one(store: EventStore, effect: Effect, tool: Tool, ctx: ToolContext) -> Effect:
    """Ask the tool what became of an unknown write; record what it finds.
    Never re-executes the write."""
    if tool.reconcile is None or effect.outcome != ev.UNKNOWN:
        return effect
    receipt = await tool.reconcile(effect.arguments, effect.dispatch, ctx)
    if receipt.state == ev.UNKNOWN:
        return effect
    record_receipt(store, effect.conversation, effect.tool_call_id, effect.tool, "reconciled", receipt.state,
                   receipt.evidence, turn=effect.turn, step=effect.step, attempt=effect.attempt)
    return replace(effect, state="reconciled", outcome=receipt.state, evidence=receipt.evidence)
