"""Asking the person before a call is dispatched (voice.agent.approvals):
the question's row, the answer (a remembered one, the client's own dialog,
or the person's next words) and its row. A part of `AgentLoop` (a mixin:
it reads the loop's store, surface, tool environment and turn state); the
loop turns an answer that is not a yes into the call's result.

The one writer of `approval/requested`; `approval/answered` goes through
`approvals.record_answer`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio

from voice.agent.approvals import (DENIED, GRANTED, WITHDRAWN, Answer, Approvals, GrantsError, Pending, ago,
                                   answer_notice, approval_question, record_answer)
from voice.agent.blocks import ToolCall
from voice.agent.tools.base import Tool
from voice.log import events as ev
from voice.log.events import UNSET

if TYPE_CHECKING:
    from voice.agent.turn_state import TurnState


class AskingFirst:
    """The loop's questions to the person (see the module)."""

    def _asked_at(self, state: TurnState) -> tuple[str, int | None, int | None, int | None]:
        return (self.conversation, state.turn, state.step, state.attempt)

    def _withdraw_restarted(self, state: TurnState, asked: ev.ApprovalRequested) -> None:
        """The question a restart left unanswered is withdrawn (`how`
        restart) where it was asked: the turn asks it again."""
        for e in self.store.events(None, types={ev.APPROVAL_REQUESTED}):
            if isinstance(e.body, ev.ApprovalRequested) and e.body.approval_id == asked.approval_id:
                state.asked_again_ago = ago(time.time() - e.at_wall)
                record_answer(self.store, e, asked.approval_id, Answer(WITHDRAWN, "restart"))
                break

    async def _ask_person(self, state: TurnState, call: ToolCall, tool: Tool, args: dict[str, Any],
                          key: tuple[str, str]) -> Answer:
        """Ask, record the question and its answer, and say what the answer
        was; an "always" is kept under `key` (source, name). A cancel (a
        barge-in, a stop, a shutdown) withdraws the question."""
        approvals: Approvals | None = self.tool_env.services.get("approvals")
        question = approval_question(tool.title or call.name, tool.source, args)
        again = state.asked_again.approval_id if state.asked_again is not None and state.step == 0 else UNSET
        if again is not UNSET:
            question = f"Before I stopped, {state.asked_again_ago}, I was asking you this. " + question
        self._record(state, ev.ApprovalRequested(approval_id=call.id, tool=call.name, server=tool.source,
                                                 title=tool.title, arguments=args, question=question,
                                                 asked_again=again))
        try:
            answer = await self._answer(state, call, tool, args, question, approvals, key)
        except anyio.get_cancelled_exc_class():
            record_answer(self.store, self._asked_at(state), call.id, Answer(WITHDRAWN, "stopped"))
            raise
        record_answer(self.store, self._asked_at(state), call.id, answer)
        said = answer_notice(answer, *key)
        if answer.always and approvals is not None and answer.how != "always":
            try:
                approvals.grants.add(*key, allow=answer.decision == GRANTED)
            except GrantsError as exc:  # the answer still counts, once
                said = f"I couldn't remember that for next time: {exc}"
        if said and getattr(self.surface, "answers_questions", False):
            await self.surface.notice(said)
        return answer

    async def _answer(self, state: TurnState, call: ToolCall, tool: Tool, args: dict[str, Any], question: str,
                      approvals: Approvals | None, key: tuple[str, str]) -> Answer:
        """The person's answer: a remembered one, the client's own dialog
        (ACP), or their next words after the question."""
        try:
            if approvals is not None and approvals.grants.allows(*key):
                return Answer(GRANTED, "always")
            if approvals is not None and approvals.grants.refuses(*key):
                return Answer(DENIED, "always")
        except GrantsError:
            pass  # an unreadable grants file grants nothing: the person is asked
        ask_client = getattr(self.surface, "ask_permission", None)
        if ask_client is not None:
            return await ask_client(call, tool, args, question)
        if approvals is None or not getattr(self.surface, "answers_questions", False):
            return Answer(DENIED, "unavailable")
        pending = Pending(call.id, self.conversation, state.turn, question)
        self.waiting_for_person = True
        try:
            await self.surface.notice(question)
            return await self._wait_answer(approvals, pending)
        finally:
            self.waiting_for_person = False

    async def _wait_answer(self, approvals: Approvals, pending: Pending) -> Answer:
        """A spoken answer is routed to `approvals` by the voice session; a
        surface that reads its answers itself (the terminal) is read here."""
        read = getattr(self.surface, "read_answer", None)
        if read is None:
            return await approvals.wait(pending)
        async with anyio.create_task_group() as tg:
            async def typed() -> None:
                words = await read()  # None: the input ended, which declines
                approvals.answer(words, how="text" if words is not None else "ended",
                                 conversation=pending.conversation)

            tg.start_soon(typed)
            answer = await approvals.wait(pending)
            tg.cancel_scope.cancel()
        return answer
