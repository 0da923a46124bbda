"""Running a step's tool calls (`ToolCalls`, the loop's part that runs
them): each call's `tool/call`, its dispatch once it may run (not a repeat
of a write whose outcome is unknown, asked first where the tool says so), a
write's receipt, and its one `tool/result`.

The one writer of `tool/call`, `tool/dispatch` and `tool/result`: start-up
recovery closes a crashed turn's calls through `record_unfinished_call`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio

from voice.agent import turn_rows as rows
from voice.agent.approvals import GRANTED
from voice.agent.asking import Questions
from voice.agent.blocks import ToolCall
from voice.agent.effects import effects, reconcile_one, record_receipt
from voice.agent.loop_settings import ToolEnv
from voice.agent.surface import ShowsToolStates, Surface
from voice.agent.tools.base import Receipt, Tool, ToolContext, ToolError, ToolOutcome, ToolRegistry
from voice.agent.turn_rows import Place
from voice.agent.turn_state import TurnState
from voice.log import events as ev
from voice.log.store import EventStore


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


@dataclass
class StepOutcome:
    """What a step's calls came to, for the text held after a write: each
    call's known effect (confirmed | failed | unknown, "" for a read) and
    the confirmed calls' own phrases ("Done, I saved the note.")."""

    receipts: list[str] = field(default_factory=list)
    phrases: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)  # the writes' names a person is shown (title, else name)


class ToolCalls:
    """The loop's tool calls (see the module). `tools` is the registry the
    next call is looked up in (an editor's session replaces it)."""

    def __init__(self, store: EventStore, tools: ToolRegistry, tool_env: ToolEnv, surface: Surface,
                 questions: Questions):
        self.store = store
        self.tools = tools
        self.tool_env = tool_env
        self.surface = surface
        self.questions = questions

    async def run(self, place: Place, state: TurnState, calls: list[ToolCall]) -> StepOutcome:
        """Run the step's calls (at `place`) in order; those not reached when
        the turn stops stay in `state.pending_calls` (`close_undispatched`),
        and so do those after a dispatched one that a stop let finish
        (`state.stop_after_dispatch`)."""
        state.pending_calls = list(calls)
        for call in calls:
            rows.record(self.store, place, ev.ToolCalled(tool_call_id=call.id, name=call.name,
                                                         arguments=call.arguments_json, provider_id=call.provider_id))
        for call in calls:
            await self._tool_state(call, "pending")
        outcome = StepOutcome()
        while state.pending_calls and state.stop_after_dispatch is None:
            call = state.pending_calls.pop(0)
            known, result = await self._run_tool(place, state, call)
            outcome.receipts.append(known)
            if known:
                tool = self.tools.get(call.name)
                outcome.writes.append(tool.title or call.name if tool is not None else call.name)
            if known == ev.CONFIRMED and result.phrase:
                outcome.phrases.append(result.phrase)
        return outcome

    async def close_undispatched(self, place: Place, state: TurnState) -> None:
        """A stopped turn's calls that never ran: each gets its one result
        (ABORTED_BEFORE_DISPATCH), and a surface that shows them says failed."""
        for call in state.pending_calls:
            result = record_unfinished_call(self.store, place, call.id, call.name, dispatched=False)
            await self._tool_state(call, "failed", result)
        state.pending_calls.clear()

    async def _run_tool(self, place: Place, state: TurnState, call: ToolCall) -> tuple[str, ev.ToolResult]:
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
            ctx = self.tool_env.context(place.conversation, state.turn, call.id)
            if write and (result := await self._blocked_repeat(place, state, call, args, ctx)) is not None:
                return ev.UNKNOWN, result
            key = tool.approval_key(args)
            if key is not None and (result := await self._approve(place, state, call, tool, args, key)) is not None:
                return "", result  # declined: nothing ran, nothing was claimed
            rows.record(self.store, place, ev.ToolDispatched(tool_call_id=call.id, name=call.name,
                                                             effect=tool.effect, arguments=args))
            dispatched = True
            await self._tool_state(call, "in_progress")
            state.dispatching = True  # from here a lost speaker lets it finish (AgentLoop.cancel)
            try:
                known, result = await self._dispatch(place, call, tool, args, ctx)
            finally:
                state.dispatching = False
            return known, result
        except anyio.get_cancelled_exc_class():
            if not dispatched:  # (stopped while an earlier write was being looked up)
                result = ev.ToolResult.not_dispatched(call.id, call.name)
            else:  # a started call produces its real result: stopped, and a write's effect unknown
                self._receipt(place, call, ev.UNKNOWN, {"cancelled": "stopped between dispatch and receipt"}, write)
                result = ev.ToolResult.stopped(call.id, call.name, ev.UNKNOWN if write else None)
            raise
        finally:
            if result is not None:
                rows.record(self.store, place, result)
                with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                    await self._tool_state(call, "completed" if result.status == "ok" and result.receipt != ev.FAILED
                                           else "failed", result)

    async def _dispatch(self, place: Place, call: ToolCall, tool: Tool, args: dict[str, Any],
                        ctx: ToolContext) -> tuple[str, ev.ToolResult]:
        """Run a dispatched call; records a write's receipt. Returns what is
        known of its effect ("" for a read) and its result."""
        write = tool.effect == "write"
        try:
            with anyio.fail_after(tool.timeout_s):
                out = await tool.run(args, ctx)
        except ToolError as exc:  # refused before any effect
            self._receipt(place, call, ev.FAILED, {"refused": str(exc)}, write)
            return (ev.FAILED if write else ""), ev.ToolResult.failed(call.id, call.name, str(exc))
        except TimeoutError:
            self._receipt(place, call, ev.UNKNOWN, {"timeout_s": tool.timeout_s}, write)
            unknown = ev.UNKNOWN if write else None
            return unknown or "", ev.ToolResult.failed(call.id, call.name, f"timed out after {tool.timeout_s} s", unknown)
        except Exception as exc:  # a tool bug must not end the conversation; the model sees the error
            self._receipt(place, call, ev.UNKNOWN, {"error": repr(exc)}, write)
            unknown = ev.UNKNOWN if write else None
            return unknown or "", ev.ToolResult.failed(call.id, call.name, f"the tool failed: {exc}", unknown)
        outcome = out if isinstance(out, ToolOutcome) else ToolOutcome(out)
        receipt = outcome.receipt
        if write and receipt is None:
            receipt = Receipt(ev.UNKNOWN, {"reason": "the tool returned no receipt"})
        if write:
            self._receipt(place, call, receipt.state, receipt.evidence, True)
        known = receipt.state if receipt else None
        return known or "", ev.ToolResult.ok(call.id, call.name, outcome.content, known, outcome.phrase)

    async def _tool_state(self, call: ToolCall, status: str, result: ev.ToolResult | None = None) -> None:
        """Tell a surface that shows tool calls (ACP) where one stands:
        pending (the model made it), in_progress (dispatched), completed or
        failed, with what the model saw of its result."""
        if isinstance(self.surface, ShowsToolStates):
            await self.surface.tool_state(call, self.tools.get(call.name), status, result)

    async def _approve(self, place: Place, state: TurnState, call: ToolCall, tool: Tool, args: dict[str, Any],
                       key: tuple[str, str]) -> ev.ToolResult | None:
        """Ask the person before dispatching (voice.agent.asking), under the
        grant `key` (`Tool.approval_key`): None once a grant is recorded,
        else the result that says why not."""
        why_not = tool.unavailable() if tool.unavailable is not None else None
        if why_not:  # nothing to ask about: it could not be sent anyway
            return ev.ToolResult.failed(call.id, call.name, why_not)
        answer = await self.questions.ask(place, state, call, tool, args, key)
        if answer.decision == GRANTED:
            return None
        return ev.ToolResult.declined(call.id, call.name, answer.how, answer.words)

    def _receipt(self, place: Place, call: ToolCall, outcome: str, evidence: dict[str, Any], write: bool) -> None:
        if write:
            record_receipt(self.store, place.conversation, call.id, call.name, "dispatch", outcome, evidence,
                           turn=place.turn, step=place.step, attempt=place.attempt)

    async def _blocked_repeat(self, place: Place, state: TurnState, call: ToolCall, args: dict[str, Any],
                              ctx: ToolContext) -> ev.ToolResult | None:
        """I9: a write identical to an earlier one is not run again when the
        earlier one's outcome is still unknown (reconcile() may resolve it
        first), or when it did happen but its turn never completed (a crash,
        a stop): the person may not have heard it was done, and a retry would
        do it twice. The latter blocks once: after the person has been told,
        asking again is a new request. Returns the `blocked` result, or None
        when the call may run."""
        earlier = [e for e in effects(self.store, place.conversation) if e.tool == call.name and e.arguments == args]
        if not earlier:
            return None
        ended = {e.turn: e.body.outcome for e in self.store.events(place.conversation, types={ev.TURN_END})}
        told = {(e.body.blocked_turn, e.body.blocked_by)  # results of this step are not read yet
                for e in self.store.events(place.conversation, types={ev.TOOL_RESULT})
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
