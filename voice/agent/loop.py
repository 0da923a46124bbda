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
closed `interrupted` instead of `aborted`. A lost speaker's cancel
(`finish_dispatched`: the person did not ask to stop) first lets a
dispatched call run to its result, then records the same; the phrase that
would have announced the outcome becomes the surface's notice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio

from voice.agent import turn_rows as rows
from voice.agent.asking import Questions
from voice.agent.blocks import REASONING, TEXT, BlockAssembler, ToolCall
from voice.agent.calls import StepOutcome, ToolCalls
from voice.agent.loop_settings import LoopSettings, ToolEnv, history_budget
from voice.agent.preempt import EarlyStart
from voice.agent.providers.base import (
    ModelRequest,
    Provider,
    ProviderError,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from voice.agent.moving_window import MovingWindow
from voice.agent.surface import Delivered, OwesPhrases, Surface, UnitRef
from voice.agent.tools.base import ToolRegistry
from voice.agent.turn_rows import Place
from voice.agent.turn_state import Streaming, TurnResult, TurnState, call_id, delivered_prefix, own_ids
from voice.log import events as ev
from voice.log.projections import provider_messages
from voice.log.window import Window
from voice.log.store import EventStore

class AgentLoop:
    """A conversation's turns. It runs the steps and streams; it composes
    the parts with their own state: `questions` (voice.agent.asking), which
    `calls` (voice.agent.calls) asks before a call that needs a yes, and
    `window` (voice.agent.moving_window)."""

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
        self.settings = settings or LoopSettings()
        self.tool_env = tool_env or ToolEnv()
        self.questions = Questions(store, surface, self.tool_env.services)
        self.calls = ToolCalls(store, tools or ToolRegistry(), self.tool_env, surface, self.questions)
        self._scope: anyio.CancelScope | None = None
        self._turn_over: anyio.Event | None = None  # set as the running turn's scope closes
        self._state: TurnState | None = None
        self._cancel_outcome = ev.ABORTED
        self._cancel_reason: str | None = None  # turn/end's reason, for a cancel that gives one
        self.current_turn: int | None = None
        self.window = MovingWindow()  # where the context window stands; summaries and warming in idle time
        self._early_count = 0
        # Called with the turn's number just before its turn/end is written, however it ends: a
        # barge-in pause still deciding over the reply ends first (voice.speech.barge_in).
        self.before_turn_end: Callable[[int], None] = lambda turn: None

    # -- public ------------------------------------------------------------

    @property
    def tools(self) -> ToolRegistry:
        return self.calls.tools

    @tools.setter
    def tools(self, tools: ToolRegistry) -> None:
        """(An editor's session replaces its registry; the next call is looked up in it.)"""
        self.calls.tools = tools

    @property
    def waiting_for_person(self) -> bool:
        """The turn waits for the person's answer to a question (voice.agent.approvals): their
        words are the answer, not a barge-in, once the question has played."""
        return self.questions.waiting_for_person

    def cancel(self, outcome: str = ev.ABORTED, reason: str | None = None, *,
               finish_dispatched: bool = False) -> bool:
        """Stop the running turn: `aborted` when the person stopped it
        (barge-in, Ctrl-C), `interrupted` for a shutdown or a lost sound
        card (`reason` audio_lost, on its turn/end). Returns False if no
        turn runs.

        `finish_dispatched` (the speaker went; the person did not ask to
        stop): a call already dispatched runs to its receipt first, and the
        turn ends as soon as it has its result; the phrase that would have
        announced the outcome is owed once the turn has ended (`_owe`), and
        the calls after it are never dispatched. So is such a phrase already
        said in the turn that had not fully played when the speaker went. A plain
        `cancel()` meanwhile stops it at once, as a barge-in always does."""
        self.cancel_idle()
        if self._scope is None:
            return False
        state = self._state
        if finish_dispatched and state is not None and state.dispatching:
            state.stop_after_dispatch = (outcome, reason)
            return True
        self._cancel_outcome, self._cancel_reason = outcome, reason
        self._scope.cancel()
        return True

    def cancel_idle(self) -> None:
        """Idle work (a summary, warming the server's cache) gives way to the
        next request at once; what is still due is done after the next turn."""
        self.window.cancel()

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
        self.cancel_idle()  # the early request outranks idle work too
        self._early_count += 1
        schemas = self.tools.schemas()
        said = [{"role": "user", "content": user_text}]  # the turn's own words count in its budget, as they will
        if fresh:
            request = self._request(Window(messages=said), schemas)
        else:  # the window as the turn will have it (moved the same way, if it moves), kept by no one
            window, _ = self.window.window(self.store, self.conversation, self._history_budget(schemas),
                                           self.settings.count_tokens, pending=said)
            request = self._request(window, schemas)
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
        self.cancel_idle()  # a turn never waits for idle work
        turn = self.store.start_turn(self.conversation, ev.TurnStart(source="approval" if asked_again else source))
        if asked_again is None:
            message = (ev.UserMessage(content=user_text, source=source) if audio is None
                       else ev.UserMessage(content=user_text, source=source, audio=audio))
            self.store.record(self.conversation, message, turn=turn)
        state = TurnState(turn, early=early, asked_again=asked_again)
        self._state = state
        self._cancel_outcome, self._cancel_reason = ev.ABORTED, None
        self.current_turn = turn
        outcome = ev.ABORTED
        with anyio.CancelScope() as scope:
            self._scope, self._turn_over = scope, anyio.Event()
            try:
                outcome = await self._run_steps(state)
            except anyio.get_cancelled_exc_class():
                outcome = self._cancel_outcome if scope.cancel_called else ev.INTERRUPTED
                reason = self._cancel_reason if scope.cancel_called else None
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.settings.stop_bound_s):
                    await self._record_cancel(state, outcome, reason)
                    await self._owe(state.unsaid)
                raise
            finally:
                over, self._turn_over = self._turn_over, None
                self._scope = None
                self._state = None
                self.current_turn = None
                over.set()
        # (no request: where the window stands for the next turn, the same however soon it comes)
        self.window.after_turn(self.store, self.conversation, self._history_budget(self.tools.schemas()),
                               self.settings.count_tokens)
        return TurnResult(turn, outcome)

    async def use_idle_time(self, turn: int) -> None:
        """After `turn`, while the person is silent (voice.agent.moving_window):
        the turns that left the window summarised, the new prefix warmed in
        the server's cache. Never awaited by a turn: the next turn (or early
        start) cancels it; what is still due is done after that turn."""
        schemas = self.tools.schemas()
        await self.window.tend(self.store, self.provider, self.conversation, turn, self._history_budget(schemas),
                               self.settings.count_tokens, lambda window: self._request(window, schemas),
                               self.settings.warm_cache)

    async def warm_at_start(self, fresh: bool) -> None:
        """As the service starts, before any request: the first request's
        prefix warmed in the server's cache (voice.agent.moving_window's
        `warm_first`); `fresh`: that request opens a new conversation. The
        first request (or early start) cancels it, as it cancels idle work."""
        schemas = self.tools.schemas()
        await self.window.warm_first(self.store, self.provider, self.conversation, self._history_budget(schemas),
                                     self.settings.count_tokens, lambda window: self._request(window, schemas),
                                     self.settings.warm_cache, fresh)

    def _request(self, window: Window, schemas: list[dict[str, Any]]) -> ModelRequest:
        # (a reply stays within what the budget kept free for it: a small model may otherwise ramble to the end of
        # the server's context, minutes of speech, while a test beside a busy machine timed out waiting)
        return ModelRequest(messages=provider_messages(window.messages, self.settings.system_prompt),
                            tools=schemas, tool_results=window.tool_results, max_tokens=self.settings.reply_tokens)

    # -- steps -------------------------------------------------------------

    async def _run_steps(self, state: TurnState) -> str:
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
                self._end_turn(state, ev.ERROR, error="the language model request failed")
                return ev.ERROR
            calls = own_ids(UnitRef(self.conversation, state.turn, state.step, state.attempt), assembler.tool_calls())
            # A completion the model streamed after its writes, once confirmed
            # and spoken, ends the turn: asking again would only repeat it.
            completed = await self._run_calls(state, calls) if calls else False
            rows.step_end(self.store, self._at(state), "tool_calls" if calls else "completed")
            state.step_open = False
            if not calls or completed:
                break
        else:
            await self.surface.notice(f"stopped after {self.settings.max_steps} steps")
        await self._wait_played(state)
        self._end_turn(state, ev.COMPLETED)
        return ev.COMPLETED

    async def _ask_again(self, state: TurnState) -> None:
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
        self.questions.withdraw_restarted(state, asked)
        await self._run_calls(state, [call])
        rows.step_end(self.store, self._at(state), "tool_calls")
        state.step_open = False

    async def _request_with_retries(self, state: TurnState) -> BlockAssembler | None:
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

    async def _stream(self, state: TurnState) -> BlockAssembler:
        """One provider request. Commits the message on a normal finish;
        on a provider error records the attempt and re-raises."""
        ref = UnitRef(self.conversation, state.turn, state.step, state.attempt)
        assembler = BlockAssembler()
        state.streaming = streaming = Streaming(ref, assembler)
        rows.stream_start(self.store, self._at(state), self._route())
        self.surface.open(ref)
        schemas = self.tools.schemas()
        window, anchor = self.window.window(self.store, self.conversation, self._history_budget(schemas, state.shrink),
                                            self.settings.count_tokens)
        request = self._request(window, schemas)
        self.window.sent(anchor)
        early, state.early = state.early, None
        if early is not None and early.request == request:  # started before the commit: read from its start
            stream = early.stream()
            streaming.early = early
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
            rows.attempt(self.store, self._at(state), "error", **self._stream_fields(streaming))
            rows.stream_failed(self.store, self._at(state), str(exc))
            rows.request_failed(self.store, self._at(state), str(exc), exc.status, exc.retryable)
            state.streaming = None
            raise
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                await stream.aclose()
        await self.surface.close(ref)
        calls = own_ids(ref, assembler.tool_calls())
        record = self._stream_fields(streaming)
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

    def _stream_fields(self, streaming: Streaming) -> dict[str, Any]:
        """What an assistant message or attempt records of its stream."""
        return {**streaming.fields(), "route": self._route()}

    async def _run_calls(self, state: TurnState, calls: list[ToolCall]) -> bool:
        """Run the step's calls, then say what was held after a write. True
        when the writes were confirmed and said so (the model's held
        completion, or the tools' phrases)."""
        outcome = await self.calls.run(self._at(state), state, calls)
        completed = await self._release_held(state, outcome)
        if state.stop_after_dispatch is not None:  # the dispatched call has its result: the stop goes ahead
            assert self._scope is not None
            self._cancel_outcome, self._cancel_reason = state.stop_after_dispatch
            self._scope.cancel()
            await anyio.sleep(0)  # (a checkpoint: the cancel is seen here)
        return completed

    async def _release_held(self, state: TurnState, outcome: StepOutcome) -> bool:
        """Text the model streamed after a write call plays only once every
        write of the step is confirmed; otherwise an honest phrase replaces
        it. When the model streamed nothing after its confirmed writes, the
        tools' own phrases ("Done, I saved the note.") say so. True when a
        confirmation was said: the turn is then complete.

        After a lost speaker (`state.stop_after_dispatch`) the phrase is not
        spoken in the turn: it is kept as an `assistant/attempt` (unsaid)
        and owed once the turn has ended (`_owe`); and since the model
        will not answer from the results, a write with no phrase at all
        still gets one that says its outcome."""
        held, state.held_text = state.held_text, ""
        writes = [r for r in outcome.receipts if r]
        lost = state.stop_after_dispatch is not None
        if not held.strip() and not writes:
            return False
        ref = UnitRef(self.conversation, state.turn, state.step, state.attempt, part=1)
        text = ""
        if writes and all(r == ev.CONFIRMED for r in writes):
            if held.strip():
                text, origin = held, "completion"
            elif outcome.phrases:
                text, origin = " ".join(outcome.phrases), "tool"
            elif lost:
                text, origin = f"Done, {' and '.join(outcome.writes)} went through.", "tool"
            else:
                return False  # nothing to say yet: the model answers from the results
        else:
            if held.strip():
                rows.attempt(self.store, self._at(state), "withheld", message_id=ref.message_id,
                             content=[{"type": "text", "text": held}], receipts=writes)
            if writes and (held.strip() or lost):  # (nothing claimed, and the model will answer: no correction)
                text = ("I couldn't confirm that it worked." if ev.UNKNOWN in writes
                        else "That didn't work.")
            origin = "receipt"
        if not text:
            return False
        if lost:  # filed as the step's part 1, as it would have been said; never history
            rows.attempt(self.store, self._at(state), "unsaid", message_id=ref.message_id,
                         content=[{"type": "text", "text": text}], receipts=writes)
            state.unsaid.append(text)
            return origin != "receipt"
        self.surface.open(ref)
        await self.surface.text(ref, text)
        await self.surface.close(ref)
        self._record(state, ev.AssistantMessage(message_id=ref.message_id, content=[{"type": "text", "text": text}],
                                                origin=origin, receipts=writes))
        state.playing.append(ref)
        state.outcome_phrases[ref] = text
        return origin != "receipt"

    # -- delivery ----------------------------------------------------------

    async def _wait_played(self, state: TurnState) -> None:
        while state.playing:
            ref = state.playing[0]
            delivered = await self.surface.wait_delivered(ref)
            if self.surface.tracks_playback:
                self._played(state, ref, delivered)
            state.playing.pop(0)

    def _played(self, state: TurnState, ref: UnitRef, d: Delivered) -> None:
        self.store.record(self.conversation, ev.SpeechPlayed(message_id=ref.message_id, chars=d.text_chars, words=d.words,
                                                             samples=d.samples, complete=d.complete),
                          turn=ref.turn, step=ref.step, attempt=ref.attempt)

    # -- cancellation ------------------------------------------------------

    async def _record_cancel(self, state: TurnState, outcome: str, reason: str | None = None) -> None:
        await self.surface.stop()
        if state.streaming is not None:
            streaming = state.streaming
            ref, assembler = streaming.ref, streaming.assembler
            assembler.close()
            content = delivered_prefix(assembler.interrupted_blocks(), self.surface.delivered(ref))
            if content:
                record = {**self._stream_fields(streaming), "content": content}
                self._record(state, ev.AssistantMessage(interrupted=True, surfaceOp="append", **record))
            else:
                rows.attempt(self.store, self._at(state), "aborted", **self._stream_fields(streaming))
            rows.stream_stopped(self.store, self._at(state))
            state.streaming = None
        for ref in state.playing:
            delivered = self.surface.delivered(ref)
            if self.surface.tracks_playback:
                self._played(state, ref, delivered)
            if reason == ev.AUDIO_LOST_REASON and ref in state.outcome_phrases and not delivered.complete:
                state.unsaid.append(state.outcome_phrases[ref])  # the person did not stop it: still owed
        state.playing.clear()
        await self.calls.close_undispatched(self._at(state), state)
        if state.step_open:
            rows.step_end(self.store, self._at(state), outcome)
            state.step_open = False
        self._end_turn(state, outcome, **({"reason": reason} if reason else {}))

    async def _owe(self, phrases: list[str]) -> None:
        """The outcome phrases a lost speaker kept from the turn, once it has
        ended: the assistant's own word now, not the turn's. A surface whose
        speaker can go delivers them itself (said once it is back, each
        `speech/owed`); it is handed them without a wait, so the turn's own
        transcript line is written first."""
        for text in phrases:
            if isinstance(self.surface, OwesPhrases):
                self.surface.owe(text)
            else:
                await self.surface.notice(text)

    def _end_turn(self, state: TurnState, outcome: str, **why: str) -> None:
        self.before_turn_end(state.turn)
        self.store.end_turn(self.conversation, state.turn, outcome, **why)

    # -- helpers -----------------------------------------------------------

    def _route(self) -> dict[str, Any]:
        r = self.provider.route
        return {"provider": r.provider, "model": r.model, "base_url": r.base_url}

    def _at(self, state: TurnState) -> Place:
        return Place(self.conversation, state.turn, state.step, state.attempt)

    def _record(self, state: TurnState, body: ev.Body) -> None:
        self.store.record(self.conversation, body, turn=state.turn, step=state.step, attempt=state.attempt)
