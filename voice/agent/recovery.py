"""Start-up recovery (I10): make the log consistent after a crash or kill -9.

For every turn without a `turn/end`, in order: a stream that was open gets
an `assistant/attempt` (its text was never committed) and its end frame;
dispatched calls without a result get one that states what the receipts
prove (`ToolResult.recovered_after_crash`), and a write with no receipt gets an `unknown`
one; committed calls never dispatched get ABORTED_BEFORE_DISPATCH; an open
step gets `step/end`; the turn ends `interrupted`. Nothing is re-executed.
Then unknown writes are reconciled where their tool can look. Turns the
person stopped (`aborted`) already ended and stay stopped: recovery starts
no step.

A call is named by (step, id) within its turn, as the log's unique indexes
name it, so recovery writes at most one result and receipt per call and
never runs into those indexes: a start on any log this program wrote
succeeds (logs from before ids were minted reuse ids across turns and, from
some servers, across steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from voice.agent import turn_rows as rows
from voice.agent.effects import effects, reconcile_one, record_receipt
from voice.agent.calls import record_unfinished_call
from voice.agent.turn_rows import Place
from voice.agent.tools.base import ToolRegistry
from voice.log import events as ev
from voice.log.store import EventStore


@dataclass
class RecoveryReport:
    closed_turns: list[tuple[str, int]] = field(default_factory=list)
    unknown_writes: int = 0
    reconciled: int = 0

    def summary(self) -> str:
        return (f"closed {len(self.closed_turns)} unfinished turn(s) as interrupted; "
                f"{self.unknown_writes} write(s) of unknown outcome, {self.reconciled} reconciled")


def close_open_turns(store: EventStore) -> list[tuple[str, int]]:
    closed = []
    for conversation, turn in store.open_turns():
        events = store.events(conversation, turn=turn)
        last = {}
        for e in events:
            if e.step is not None:
                last["step"], last["attempt"] = e.step, e.attempt

        def at(step=None, attempt=None) -> Place:
            return Place(conversation, turn, step, attempt)

        open_streams = {}
        for e in events:
            key = (e.step, e.attempt)
            if e.type == ev.ASSISTANT_STREAM:
                if e.body.frame == "start":
                    open_streams[key] = True
                else:
                    open_streams.pop(key, None)
            elif e.type in (ev.ASSISTANT_MESSAGE, ev.ASSISTANT_ATTEMPT) and key in open_streams:
                open_streams[key] = False  # committed, only the end frame is missing
        for (step, attempt), uncommitted in open_streams.items():
            if uncommitted:
                rows.attempt(store, at(step, attempt), "crashed", message_id=f"{turn}.{step}.{attempt}", content=[],
                             stream=[])
            rows.stream_stopped(store, at(step, attempt), "crashed")

        def key(e) -> tuple[int | None, str]:
            return e.step, e.body.tool_call_id

        results = {key(e) for e in events if e.type == ev.TOOL_RESULT}
        dispatched = {key(e): e.body for e in events if e.type == ev.TOOL_DISPATCH}
        receipts = {key(e): e.body.state for e in events
                    if e.type == ev.EFFECT_RECEIPT and e.body.phase == "dispatch"}
        for e in events:
            if e.type != ev.TOOL_CALL or key(e) in results:
                continue
            results.add(key(e))  # one result per call, even if a provider repeated an id in one message
            call_id, name = e.body.tool_call_id, e.body.name
            d = dispatched.get(key(e))
            if d is None:
                record_unfinished_call(store, at(e.step, e.attempt), call_id, name, dispatched=False)
                continue
            write = d.effect == "write"
            receipt = receipts.get(key(e))
            if write and receipt is None:
                receipt = ev.UNKNOWN
                record_receipt(store, conversation, call_id, name, "dispatch", ev.UNKNOWN,
                               {"crashed": "the process stopped between dispatch and receipt"},
                               turn=turn, step=e.step, attempt=e.attempt)
            record_unfinished_call(store, at(e.step, e.attempt), call_id, name, dispatched=True,
                                   receipt=receipt if write else None)
        starts = sum(1 for e in events if e.type == ev.STEP_START)
        ends = sum(1 for e in events if e.type == ev.STEP_END)
        if starts > ends:
            rows.step_end(store, at(last.get("step"), last.get("attempt")), ev.INTERRUPTED)
        if store.end_turn(conversation, turn, ev.INTERRUPTED, reason="restart"):
            closed.append((conversation, turn))
    return closed


async def recover(store: EventStore, tools: ToolRegistry, tool_env) -> RecoveryReport:
    report = RecoveryReport(closed_turns=close_open_turns(store))
    for effect in effects(store):
        if effect.outcome != ev.UNKNOWN:
            continue
        report.unknown_writes += 1
        tool = tools.get(effect.tool)
        if tool is not None and tool.reconcile is not None:
            ctx = tool_env.context(effect.conversation, effect.turn, effect.tool_call_id)
            if (await reconcile_one(store, effect, tool, ctx)).state == "reconciled":
                report.reconciled += 1
    if report.closed_turns or report.unknown_writes:
        conversation = report.closed_turns[0][0] if report.closed_turns else (store.latest_conversation() or "")
        store.record_recovery(conversation, closed_turns=[t for _, t in report.closed_turns],
                              unknown_writes=report.unknown_writes, reconciled=report.reconciled)
    return report
