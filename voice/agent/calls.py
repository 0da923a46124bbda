"""Running a step's tool calls (a part of `AgentLoop`, as a mixin: it reads
the loop's store, tools, tool environment and surface): each call's
`tool/call`, its dispatch once it may run (not a repeat of a write whose
outcome is unknown, asked first where the tool says so), a write's receipt,
and its one `tool/result`.

The one writer of `tool/call`, `tool/dispatch` and `tool/result`: start-up
recovery closes a crashed turn's calls through `record_unfinished_call`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from voice.agent import turn_rows as rows
from voice.agent.approvals import GRANTED
from voice.agent.blocks import ToolCall
from voice.agent.effects import effects, reconcile_one, record_receipt
from voice.agent.tools.base import ToolError
from voice.agent.tools.base import Receipt, Tool, ToolContext, ToolOutcome
from voice.agent.turn_rows import Place
from voice.log import events as ev
from voice.log.store import EventStore

if TYPE_CHECKING:
    from voice.agent.turn_state import TurnState


def record_unfinished_call(store: EventStore, place: Place, call_id: str, name: str, *, dispatched: bool,
                           receipt: str | None = None) -> ev.ToolResult:
    """The one result of a call its turn never finished: not dispatched (a
    stop, a shutdown, a crash before it ran), or dispatched and then the
    process died (start-up recovery: what its receipt proves, never more).
    Recovery closes a crashed turn's calls through here."""
    result = (ev.ToolResult.recovered_after_crash(call_id, name, receipt) if dispatched
              else ev.ToolResult.not_dispatched(call_id, name))
    rows.record(store, place, result)
    return result


class RunningCalls:
    """The loop's tool calls (see the module)."""

    async def _run_tools(self, state: TurnState, calls: list[ToolCall]) -> bool:
        """Run the step's calls in order. True when the writes were confirmed
        and said so (the model's held completion, or the tools' phrases)."""
        state.pending_calls = list(calls)
        for call in calls:
            self._record(state, ev.ToolCalled(tool_call_id=call.id, name=call.name, arguments=call.arguments_json,
                                              provider_id=call.provider_id))
        for call in calls:
            await self._tool_state(call, "pending")
        receipts: list[str] = []
        phrases: list[str] = []
        while state.pending_calls:
            call = state.pending_calls.pop(0)
            known, result = await self._run_tool(state, call)
            receipts.append(known)
            if known == ev.CONFIRMED and result.phrase:
                phrases.append(result.phrase)
        return await self._release_held(state, receipts, phrases)

    async def _run_tool(self, state: TurnState, call: ToolCall) -> tuple[str, ev.ToolResult]:
        """Run one call and record its one `tool/result`. Returns, with the
        result, what is known of the call's effect for the held completion:
        confirmed | failed | unknown, "" for a read."""
        tool = self.tools.get(call.name)
        write = tool is not None and tool.effect == "write"
        result: ev.ToolResult | None = None
        dispatched = False
        try:
            if tool is None:
                result, known = ev.ToolResult.failed(call.id, call.name, f"no tool named {call.name!r}"), ev.FAILED
                return known, result
            try:
                args = call.arguments()
            except ValueError as exc:
                result = ev.ToolResult.failed(call.id, call.name, str(exc))
                return (ev.FAILED if write else ""), result
            ctx = self.tool_env.context(self.conversation, state.turn, call.id)
            if write and (result := await self._blocked_repeat(state, call, args, ctx)) is not None:
                return ev.UNKNOWN, result
            key = tool.approval_key(args)
            if key is not None and (result := await self._approve(state, call, tool, args, key)) is not None:
                return "", result  # declined: nothing ran, nothing was claimed
            self._record(state, ev.ToolDispatched(tool_call_id=call.id, name=call.name, effect=tool.effect,
                                                  arguments=args))
            dispatched = True
            await self._tool_state(call, "in_progress")
            known, result = await self._dispatch(state, call, tool, args, ctx)
            return known, result
        except anyio.get_cancelled_exc_class():
            if not dispatched:  # (stopped while an earlier write was being looked up)
                result = ev.ToolResult.not_dispatched(call.id, call.name)
            else:  # a started call produces its real result: stopped, and a write's effect unknown
                self._receipt(state, call, ev.UNKNOWN, {"cancelled": "stopped between dispatch and receipt"}, write)
                result = ev.ToolResult.stopped(call.id, call.name, ev.UNKNOWN if write else None)
            raise
        finally:
            if result is not None:
                self._record(state, result)
                with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                    await self._tool_state(call, "completed" if result.status == "ok" and result.receipt != ev.FAILED
                                           else "failed", result)

    async def _dispatch(self, state: TurnState, call: ToolCall, tool: Tool, args: dict[str, Any],
                        ctx: ToolContext) -> tuple[str, ev.ToolResult]:
        """Run a dispatched call; records a write's receipt. Returns what is
        known of its effect ("" for a read) and its result."""
        write = tool.effect == "write"
        try:
            with anyio.fail_after(tool.timeout_s):
                out = await tool.run(args, ctx)
        except ToolError as exc:  # refused before any effect
            self._receipt(state, call, ev.FAILED, {"refused": str(exc)}, write)
            return (ev.FAILED if write else ""), ev.ToolResult.failed(call.id, call.name, str(exc))
        except TimeoutError:
            self._receipt(state, call, ev.UNKNOWN, {"timeout_s": tool.timeout_s}, write)
            unknown = ev.UNKNOWN if write else None
            return unknown or "", ev.ToolResult.failed(call.id, call.name, f"timed out after {tool.timeout_s} s", unknown)
        except Exception as exc:  # a tool bug must not end the conversation; the model sees the error
            self._receipt(state, call, ev.UNKNOWN, {"error": repr(exc)}, write)
            unknown = ev.UNKNOWN if write else None
            return unknown or "", ev.ToolResult.failed(call.id, call.name, f"the tool failed: {exc}", unknown)
        outcome = out if isinstance(out, ToolOutcome) else ToolOutcome(out)
        receipt = outcome.receipt
        if write and receipt is None:
            receipt = Receipt(ev.UNKNOWN, {"reason": "the tool returned no receipt"})
        if write:
            self._receipt(state, call, receipt.state, receipt.evidence, True)
        known = receipt.state if receipt else None
        return known or "", ev.ToolResult.ok(call.id, call.name, outcome.content, known, outcome.phrase)

    async def _tool_state(self, call: ToolCall, status: str, result: ev.ToolResult | None = None) -> None:
        """Tell a surface that shows tool calls (ACP) where one stands:
        pending (the model made it), in_progress (dispatched), completed or
        failed, with what the model saw of its result."""
        show = getattr(self.surface, "tool_state", None)
        if show is not None:
            tool = self.tools.get(call.name)
            await show(call, tool, status, result)

    async def _approve(self, state: TurnState, call: ToolCall, tool: Tool, args: dict[str, Any],
                       key: tuple[str, str]) -> ev.ToolResult | None:
        """Ask the person before dispatching (voice.agent.asking), under the
        grant `key` (`Tool.approval_key`): None once a grant is recorded,
        else the result that says why not."""
        why_not = tool.unavailable() if tool.unavailable is not None else None
        if why_not:  # nothing to ask about: it could not be sent anyway
            return ev.ToolResult.failed(call.id, call.name, why_not)
        answer = await self._ask_person(state, call, tool, args, key)
        if answer.decision == GRANTED:
            return None
        return ev.ToolResult.declined(call.id, call.name, answer.how, answer.words)

    def _receipt(self, state: TurnState, call: ToolCall, outcome: str, evidence: dict[str, Any], write: bool) -> None:
        if write:
            record_receipt(self.store, self.conversation, call.id, call.name, "dispatch", outcome, evidence,
                           turn=state.turn, step=state.step, attempt=state.attempt)

    async def _blocked_repeat(self, state: TurnState, call: ToolCall, args: dict[str, Any],
                              ctx: ToolContext) -> ev.ToolResult | None:
        """I9: a write identical to an earlier one is not run again when the
        earlier one's outcome is still unknown (reconcile() may resolve it
        first), or when it did happen but its turn never completed (a crash,
        a stop): the person may not have heard it was done, and a retry would
        do it twice. The latter blocks once: after the person has been told,
        asking again is a new request. Returns the `blocked` result, or None
        when the call may run."""
        earlier = [e for e in effects(self.store, self.conversation) if e.tool == call.name and e.arguments == args]
        if not earlier:
            return None
        ended = {e.turn: e.body.outcome for e in self.store.events(self.conversation, types={ev.TURN_END})}
        told = {(e.body.blocked_turn, e.body.blocked_by)  # results of this step are not read yet
                for e in self.store.events(self.conversation, types={ev.TOOL_RESULT})
                if e.body.status == ev.BLOCKED and (e.turn, e.step) != (state.turn, state.step)}
        for effect in earlier:
            if effect.outcome == ev.UNKNOWN:
                tool = self.tools.get(call.name)
                if tool is not None and tool.reconcile is not None:
                    effect = await reconcile_one(self.store, effect, tool, ctx)
            blocking = effect.outcome == ev.UNKNOWN or (
                effect.outcome == ev.CONFIRMED and ended.get(effect.turn) != ev.COMPLETED
                and (effect.turn, effect.tool_call_id) not in told)
            if blocking:
                return ev.ToolResult.blocked(call.id, call.name, earlier=effect.outcome, blocked_by=effect.tool_call_id,
                                             blocked_turn=effect.turn, this_turn=state.turn)
        return None
