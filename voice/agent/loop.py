"""The agent loop: turn -> steps -> provider request -> stream -> tools.

Cancellation (docs/ARCHITECTURE.md, "The cancellation protocol"): a turn owns a cancel scope; `cancel()` is
`scope.cancel()`, so the decision is seen at every await of the turn (the
provider stream, a tool, a retry back-off, waiting for playback). What the
turn leaves behind is then recorded shielded, under a deadline:

- a stream in flight becomes an `assistant/message` (interrupted,
  surfaceOp "append") holding the delivered prefix *as the surface reports
  it*, intersected with `interrupted_blocks()`, or an `assistant/attempt`
  when nothing of it was delivered;
- committed messages still playing get a `speech/played` amendment;
- committed tool calls never dispatched get ABORTED_BEFORE_DISPATCH results;
- then `agent/assistant-stream` end < `step/end` < `turn/end`.

A cancel from outside the turn (shutdown) records the same, with the turn
closed `interrupted` instead of `aborted`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from pathlib import Path

import anyio

from voice.agent.approvals import GRANTED
from voice.agent.asking import AskingFirst
from voice.agent.effects import effects, reconcile_one, record_receipt
from voice.agent.preempt import EarlyStart
from voice.agent.blocks import BlockAssembler, Block, ToolCall, REASONING, TEXT
from voice.agent.providers.base import (
    ModelRequest,
    Provider,
    ProviderError,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from voice.agent.summary import due as summary_due
from voice.agent.summary import summarize, summarizes
from voice.agent.surface import Delivered, Surface, UnitRef
from voice.agent import turn_rows as rows
from voice.agent.turn_rows import Place
from voice.agent.tools import ToolError, ToolRegistry
from voice.agent.tools.base import Receipt, Tool, ToolContext, ToolOutcome
from voice.log import events as ev
from voice.log.projections import derive_history, provider_messages
from voice.log.window import TokenCounter, estimate_tokens, message_tokens, tools_tokens
from voice.log.store import EventStore
from voice.paths import data_dir


@dataclass
class LoopSettings:
    system_prompt: str = ""
    retries: int = 1  # extra attempts after a retryable provider error
    retry_backoff_s: float = 0.5
    max_steps: int = 8
    stop_bound_s: float = 2.0  # shielded clean-up after a cancel
    # The context budget (voice.log.window): a request's messages and tool
    # schemas stay within context_tokens - reply_tokens.
    context_tokens: int = 4096
    reply_tokens: int = 512
    count_tokens: TokenCounter = estimate_tokens


@dataclass
class ToolEnv:
    """What tools get to know and use, beyond their arguments."""

    data_dir: Path = field(default_factory=data_dir)
    commands: dict[str, list[str]] = field(default_factory=dict)
    kill_after_s: float = 2.0
    services: dict[str, Any] = field(default_factory=dict)
    command_env: dict[str, str] = field(default_factory=dict)  # see voice.runtime.command_environment

    def context(self, conversation: str, turn: int, tool_call_id: str) -> ToolContext:
        return ToolContext(conversation, turn, tool_call_id, self.data_dir, self.commands, max(0.0, self.kill_after_s),
                           self.services, self.command_env)


@dataclass
class _Streaming:
    ref: UnitRef
    assembler: BlockAssembler


@dataclass
class _TurnState:
    turn: int
    step: int = 0
    attempt: int = 0
    step_open: bool = False
    streaming: _Streaming | None = None
    # Committed messages whose delivery may still be under way (voice).
    playing: list[UnitRef] = field(default_factory=list)
    pending_calls: list[ToolCall] = field(default_factory=list)  # committed, not dispatched
    held_text: str = ""  # streamed after a write call; waits for its receipt
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
    the log for its whole life, because the turn id is (docs/ARCHITECTURE.md), whatever
    ids the provider sends ("call_0" in every request, "skill_1" in every
    process, none at all). Letters, digits and "_" only: providers accept it
    when history goes back to them."""
    return f"call_{ref.turn}_{ref.step}_{ref.attempt}_{index}"


def _own_ids(ref: UnitRef, calls: list[ToolCall]) -> list[ToolCall]:
    return [replace(c, id=call_id(ref, n)) for n, c in enumerate(calls)]


def _truncate(blocks: list[Block], delivered: Delivered) -> list[dict[str, Any]]:
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


def record_unfinished_call(store: EventStore, place: Place, call_id: str, name: str, *, dispatched: bool,
                           receipt: str | None = None) -> ev.ToolResult:
    """The one result of a call its turn never finished: not dispatched (a
    stop, a shutdown, a crash before it ran), or dispatched and then the
    process died (start-up recovery: what its receipt proves, never more).
    The loop is the writer of tool results; recovery closes a crashed turn's
    calls through here."""
    result = (ev.ToolResult.recovered_after_crash(call_id, name, receipt) if dispatched
              else ev.ToolResult.not_dispatched(call_id, name))
    rows.record(store, place, result)
    return result


def history_budget(s: LoopSettings, schemas: list[dict[str, Any]]) -> int:
    """Tokens left for the conversation once the system prompt, the tool
    schemas and the reply's reserve are counted."""
    fixed = message_tokens({"content": s.system_prompt}, s.count_tokens) + tools_tokens(schemas, s.count_tokens)
    return max(0, s.context_tokens - s.reply_tokens - fixed)


class AgentLoop(AskingFirst):
    def __init__(
        self,
        store: EventStore,
        provider: Provider,
        surface: Surface,
        conversation: str,
        tools: ToolRegistry | None = None,
        settings: LoopSettings | None = None,
        tool_env: ToolEnv | None = None,
    ):
        self.store = store
        self.provider = provider
        self.surface = surface
        self.conversation = conversation
        self.tools = tools or ToolRegistry()
        self.settings = settings or LoopSettings()
        self.tool_env = tool_env or ToolEnv()
        self._scope: anyio.CancelScope | None = None
        self._turn_over: anyio.Event | None = None  # set as the running turn's scope closes
        self._state: _TurnState | None = None
        self._cancel_outcome = ev.ABORTED
        self.current_turn: int | None = None
        self._summary_scope: anyio.CancelScope | None = None
        self._early_count = 0
        # The turn waits for the person's answer to a question (voice.agent.approvals): their words
        # are the answer, not a barge-in, once the question has played.
        self.waiting_for_person = False

    # -- public ------------------------------------------------------------

    def cancel(self, outcome: str = ev.ABORTED) -> bool:
        """Stop the running turn: `aborted` when the person stopped it
        (barge-in, Ctrl-C), `interrupted` for a shutdown. Returns False if
        no turn runs."""
        self.cancel_summary()
        if self._scope is None:
            return False
        self._cancel_outcome = outcome
        self._scope.cancel()
        return True

    def cancel_summary(self) -> None:
        """A summary being written after a turn gives way to the next request
        (it is asked for again after the next turn)."""
        if self._summary_scope is not None:
            self._summary_scope.cancel()

    def in_flight(self) -> BlockAssembler | None:
        """The assembler of the provider request in flight, if any (status, tests)."""
        turn_state = self._state
        return turn_state.streaming.assembler if turn_state and turn_state.streaming else None

    @property
    def busy(self) -> bool:
        return self._scope is not None

    async def wait_idle(self) -> None:
        """Return once no turn runs: at once when none does, else when the
        running one has ended, its stop recorded (after `cancel()`, the
        shutdown waits here). Cancellable like any wait."""
        while self._turn_over is not None:
            await self._turn_over.wait()

    def start_early(self, user_text: str, *, fresh: bool = False) -> EarlyStart:
        """The request a turn for `user_text` would send now, to be run (its
        `run()`) before the turn is committed; it only buffers. Built as
        `_stream` builds it (the same window); a request that differs is
        dropped at the commit, never used. `fresh`: the turn will open a new
        conversation (the idle gap passed), so no history."""
        self._early_count += 1
        schemas = self.tools.schemas()
        said = [{"role": "user", "content": user_text}]  # the turn's own words count in its budget, as they will
        history = None if fresh else derive_history(self.store, self.conversation,
                                                    budget=self._history_budget(schemas),
                                                    count=self.settings.count_tokens, pending=said)
        messages = history.messages if history else said
        request = ModelRequest(messages=provider_messages(messages, self.settings.system_prompt),
                               tools=schemas, tool_results=history.tool_results if history else {})
        return EarlyStart(user_text, request, self.provider, self._early_count)

    def drop_early(self, early: EarlyStart) -> None:
        """Cancel an early start that no turn will read, and keep what it
        streamed for the record: an attempt in no turn, never history."""
        early.cancel()
        assembler = BlockAssembler()
        for delta in early.deltas:
            assembler.feed(delta)
        assembler.close()
        rows.attempt(self.store, Place(self.conversation), "superseded", message_id=early.message_id,
                     content=assembler.content_blocks(), route=self._route(), finish_reason=assembler.finish_reason)

    async def run_turn(self, user_text: str, *, source: str = "text", audio: dict[str, Any] | None = None,
                       early: EarlyStart | None = None, asked_again: ev.ApprovalRequested | None = None) -> TurnResult:
        """`audio`: a spoken request's utterance ({start, end: mic positions,
        stt_ms}), kept on its `user/message`; `early`: its request started
        before the turn was committed (voice.agent.preempt); `asked_again`:
        instead of a request, a question a restart left unanswered: the turn
        asks it again (`user_text` is then unused), and on a yes dispatches
        the call and answers from its result."""
        # A lone surrogate (from a client's JSON) cannot be stored as UTF-8:
        # replaced here, before the turn opens, so a turn never stays open.
        user_text = user_text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        turn = self.store.start_turn(self.conversation, ev.TurnStart(source="approval" if asked_again else source))
        if asked_again is None:
            message = (ev.UserMessage(content=user_text, source=source) if audio is None
                       else ev.UserMessage(content=user_text, source=source, audio=audio))
            self.store.record(self.conversation, message, turn=turn)
        state = _TurnState(turn, early=early, asked_again=asked_again)
        self._state = state
        self._cancel_outcome = ev.ABORTED
        self.current_turn = turn
        outcome = ev.ABORTED
        with anyio.CancelScope() as scope:
            self._scope, self._turn_over = scope, anyio.Event()
            try:
                outcome = await self._run_steps(state)
            except anyio.get_cancelled_exc_class():
                outcome = self._cancel_outcome if scope.cancel_called else ev.INTERRUPTED
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.settings.stop_bound_s):
                    await self._record_cancel(state, outcome)
                raise
            finally:
                over, self._turn_over = self._turn_over, None
                self._scope = None
                self._state = None
                self.current_turn = None
                over.set()
        return TurnResult(turn, outcome)

    async def summarize_after(self, turn: int) -> None:
        """After a turn, once its reply is out (off the turn's critical path):
        when older turns no longer fit the window, the model summarises them
        (voice.agent.summary). Not for the offline providers. `cancel()` or
        `cancel_summary()` (a new request) ends it; it is asked for again
        after the next turn."""
        if not summarizes(self.provider):
            return
        budget = self._history_budget(self.tools.schemas())
        turns = summary_due(self.store, self.conversation, budget, self.settings.count_tokens)
        if turns is None:
            return
        with anyio.CancelScope() as scope:
            self._summary_scope = scope
            try:
                await summarize(self.store, self.provider, self.conversation, turn, turns, budget,
                                self.settings.count_tokens)
            finally:
                self._summary_scope = None

    # -- steps -------------------------------------------------------------

    async def _run_steps(self, state: _TurnState) -> str:
        first = 0
        if state.asked_again is not None:
            await self._ask_again(state)
            first = 1
        for step in range(first, self.settings.max_steps):
            state.step, state.attempt = step, 0
            rows.step_start(self.store, self._at(state), self._route())
            state.step_open = True
            assembler = await self._request_with_retries(state)
            if assembler is None:
                rows.step_end(self.store, self._at(state), "error")
                state.step_open = False
                self.store.end_turn(self.conversation, state.turn, ev.ERROR, error="the language model request failed")
                return ev.ERROR
            calls = _own_ids(UnitRef(self.conversation, state.turn, state.step, state.attempt), assembler.tool_calls())
            # A completion the model streamed after its writes, once confirmed
            # and spoken, ends the turn: asking again would only repeat it.
            completed = await self._run_tools(state, calls) if calls else False
            rows.step_end(self.store, self._at(state), "tool_calls" if calls else "completed")
            state.step_open = False
            if not calls or completed:
                break
        else:
            await self.surface.notice(f"stopped after {self.settings.max_steps} steps")
        await self._wait_played(state)
        self.store.end_turn(self.conversation, state.turn, ev.COMPLETED)
        return ev.COMPLETED

    async def _ask_again(self, state: _TurnState) -> None:
        """Step 0 of a turn that asks again what a restart left unanswered:
        the call as the model made it, run through the approval again (its
        old question is withdrawn, answered `restart`); nothing is
        dispatched without a new yes."""
        asked = state.asked_again
        assert asked is not None
        rows.step_start(self.store, self._at(state), self._route())
        state.step_open = True
        ref = UnitRef(self.conversation, state.turn, 0, 0)
        call = ToolCall(call_id(ref, 0), asked.tool, json.dumps(asked.arguments, ensure_ascii=False))
        self._record(state, ev.AssistantMessage(message_id=ref.message_id, content=[], origin="asked-again",
                                                tool_calls=[call.to_openai()]))
        self._withdraw_restarted(state, asked)
        await self._run_tools(state, [call])
        rows.step_end(self.store, self._at(state), "tool_calls")
        state.step_open = False

    async def _request_with_retries(self, state: _TurnState) -> BlockAssembler | None:
        attempt = retries = 0
        while True:
            state.attempt = attempt
            try:
                return await self._stream(state)
            except ProviderError as exc:
                attempt += 1
                if exc.context_exceeded and state.shrink == 1:
                    # Our count was off for this model: the same request
                    # would fail again, a window half as long may not. Once.
                    state.shrink = 2
                    continue
                if not exc.retryable or retries == self.settings.retries:
                    await self.surface.notice(f"the language model failed: {exc}")
                    return None
            await anyio.sleep(self.settings.retry_backoff_s * (2**retries))
            retries += 1

    def _history_budget(self, schemas: list[dict[str, Any]], shrink: int = 1) -> int:
        return history_budget(self.settings, schemas) // shrink

    async def _stream(self, state: _TurnState) -> BlockAssembler:
        """One provider request. Commits the message on a normal finish;
        on a provider error records the attempt and re-raises."""
        ref = UnitRef(self.conversation, state.turn, state.step, state.attempt)
        assembler = BlockAssembler()
        state.streaming = _Streaming(ref, assembler)
        rows.stream_start(self.store, self._at(state), self._route())
        self.surface.open(ref)
        schemas = self.tools.schemas()
        history = derive_history(self.store, self.conversation, budget=self._history_budget(schemas, state.shrink),
                                 count=self.settings.count_tokens)
        request = ModelRequest(messages=provider_messages(history.messages, self.settings.system_prompt),
                               tools=schemas, tool_results=history.tool_results)
        early, state.early = state.early, None
        if early is not None and early.request == request:  # started before the commit: read from its start
            stream = early.stream()
        else:
            if early is not None:
                self.drop_early(early)
            stream = self.provider.stream(request)
        gate: int | None = None  # blocks from here on follow a write call: held back
        try:
            async for delta in stream:
                assembler.feed(delta)
                if gate is None and isinstance(delta, ToolCallDelta) and self.tools.is_write(delta.name):
                    gate = len(assembler.blocks) - 1
                if isinstance(delta, TextDelta):
                    if gate is None:
                        await self.surface.text(ref, delta.text)
                elif isinstance(delta, ReasoningDelta):
                    await self.surface.reasoning(ref, delta.text)
        except ProviderError as exc:
            assembler.note_error(str(exc))
            assembler.close()
            self.surface.discard(ref, "error")
            rows.attempt(self.store, self._at(state), "error", **self._stream_fields(ref, assembler))
            rows.stream_failed(self.store, self._at(state), str(exc))
            rows.request_failed(self.store, self._at(state), str(exc), exc.status, exc.retryable)
            state.streaming = None
            raise
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                await stream.aclose()
        await self.surface.close(ref)
        calls = _own_ids(ref, assembler.tool_calls())
        record = self._stream_fields(ref, assembler)
        if gate is not None:  # the message holds what came before the write; the rest waits for receipts
            state.held_text = "".join(b.text for b in assembler.blocks[gate:] if b.type == TEXT)
            record["content"] = [b.to_json() for b in assembler.blocks[:gate] if b.type in (TEXT, REASONING) and b.text.strip()]
        if not record["content"] and not calls:
            rows.attempt(self.store, self._at(state), "empty", **record)
        else:
            self._record(state, ev.AssistantMessage(tool_calls=[c.to_openai() for c in calls], **record))
            state.playing.append(ref)
        rows.stream_end(self.store, self._at(state), assembler.finish_reason)
        state.streaming = None
        return assembler

    def _stream_fields(self, ref: UnitRef, assembler: BlockAssembler) -> dict[str, Any]:
        """What an assistant message or attempt records of its stream."""
        return {"message_id": ref.message_id, "content": assembler.content_blocks(), "route": self._route(),
                "finish_reason": assembler.finish_reason, "stream": assembler.timed_stream}

    # -- tools -------------------------------------------------------------

    async def _run_tools(self, state: _TurnState, calls: list[ToolCall]) -> bool:
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

    async def _run_tool(self, state: _TurnState, call: ToolCall) -> tuple[str, ev.ToolResult]:
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
            if tool.ask_first and (result := await self._approve(state, call, tool, args)) is not None:
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

    async def _dispatch(self, state: _TurnState, call: ToolCall, tool: Tool, args: dict[str, Any],
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

    async def _approve(self, state: _TurnState, call: ToolCall, tool: Tool,
                       args: dict[str, Any]) -> ev.ToolResult | None:
        """Ask the person before dispatching (voice.agent.asking): None once
        a grant is recorded, else the result that says why not."""
        why_not = tool.unavailable() if tool.unavailable is not None else None
        if why_not:  # nothing to ask about: it could not be sent anyway
            return ev.ToolResult.failed(call.id, call.name, why_not)
        answer = await self._ask_person(state, call, tool, args)
        if answer.decision == GRANTED:
            return None
        return ev.ToolResult.declined(call.id, call.name, answer.how, answer.words)

    def _receipt(self, state: _TurnState, call: ToolCall, outcome: str, evidence: dict[str, Any], write: bool) -> None:
        if write:
            record_receipt(self.store, self.conversation, call.id, call.name, "dispatch", outcome, evidence,
                           turn=state.turn, step=state.step, attempt=state.attempt)

    async def _blocked_repeat(self, state: _TurnState, call: ToolCall, args: dict[str, Any],
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

    async def _release_held(self, state: _TurnState, receipts: list[str], phrases: list[str]) -> bool:
        """Text the model streamed after a write call plays only once every
        write of the step is confirmed; otherwise an honest phrase replaces
        it. When the model streamed nothing after its confirmed writes, the
        tools' own phrases ("Done, I saved the note.") say so. True when a
        confirmation was said: the turn is then complete."""
        held, state.held_text = state.held_text, ""
        writes = [r for r in receipts if r]
        if not held.strip() and not writes:
            return False
        ref = UnitRef(self.conversation, state.turn, state.step, state.attempt, part=1)
        if writes and all(r == ev.CONFIRMED for r in writes):
            if held.strip():
                text, origin = held, "completion"
            elif phrases:
                text, origin = " ".join(phrases), "tool"
            else:
                return False  # nothing to say yet: the model answers from the results
        else:
            if held.strip():
                rows.attempt(self.store, self._at(state), "withheld", message_id=ref.message_id,
                             content=[{"type": "text", "text": held}], receipts=writes)
            if not writes or not held.strip():
                return False  # nothing was claimed, so nothing needs correcting
            text = ("I couldn't confirm that it worked." if ev.UNKNOWN in writes
                    else "That didn't work.")
            origin = "receipt"
        self.surface.open(ref)
        await self.surface.text(ref, text)
        await self.surface.close(ref)
        self._record(state, ev.AssistantMessage(message_id=ref.message_id, content=[{"type": "text", "text": text}],
                                                origin=origin, receipts=writes))
        state.playing.append(ref)
        return origin != "receipt"

    # -- delivery ----------------------------------------------------------

    async def _wait_played(self, state: _TurnState) -> None:
        while state.playing:
            ref = state.playing[0]
            delivered = await self.surface.wait_delivered(ref)
            if self.surface.tracks_playback:
                self._played(state, ref, delivered)
            state.playing.pop(0)

    def _played(self, state: _TurnState, ref: UnitRef, d: Delivered) -> None:
        self.store.record(self.conversation, ev.SpeechPlayed(message_id=ref.message_id, chars=d.text_chars, words=d.words,
                                                             samples=d.samples, complete=d.complete),
                          turn=ref.turn, step=ref.step, attempt=ref.attempt)

    # -- cancellation ------------------------------------------------------

    async def _record_cancel(self, state: _TurnState, outcome: str) -> None:
        await self.surface.stop()
        if state.streaming is not None:
            ref, assembler = state.streaming.ref, state.streaming.assembler
            assembler.close()
            content = _truncate(assembler.interrupted_blocks(), self.surface.delivered(ref))
            if content:
                record = {**self._stream_fields(ref, assembler), "content": content}
                self._record(state, ev.AssistantMessage(interrupted=True, surfaceOp="append", **record))
            else:
                rows.attempt(self.store, self._at(state), "aborted", **self._stream_fields(ref, assembler))
            rows.stream_stopped(self.store, self._at(state))
            state.streaming = None
        if self.surface.tracks_playback:
            for ref in state.playing:
                self._played(state, ref, self.surface.delivered(ref))
        state.playing.clear()
        for call in state.pending_calls:
            result = record_unfinished_call(self.store, self._at(state), call.id, call.name, dispatched=False)
            await self._tool_state(call, "failed", result)
        state.pending_calls.clear()
        if state.step_open:
            rows.step_end(self.store, self._at(state), outcome)
            state.step_open = False
        self.store.end_turn(self.conversation, state.turn, outcome)

    # -- helpers -----------------------------------------------------------

    def _route(self) -> dict[str, Any]:
        r = self.provider.route
        return {"provider": r.provider, "model": r.model, "base_url": r.base_url}

    def _at(self, state: _TurnState) -> Place:
        return Place(self.conversation, state.turn, state.step, state.attempt)

    def _record(self, state: _TurnState, body: ev.Body) -> None:
        self.store.record(self.conversation, body, turn=state.turn, step=state.step, attempt=state.attempt)
