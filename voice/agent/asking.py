"""Asking the person before a call is dispatched (voice.agent.approvals):
the question's row, the answer (a remembered one, the client's own dialog,
or the person's next words) and its row. `Questions` is the loop's part
that asks; the calls (voice.agent.calls) turn an answer that is not a yes
into the call's result.

The one writer of `approval/requested`; `approval/answered` goes through
`approvals.record_answer`.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from voice.agent import turn_rows as rows
from voice.agent.approvals import (DENIED, GRANTED, WITHDRAWN, Answer, Approvals, GrantsError, Pending, ago,
                                   answer_notice, approval_question, record_answer)
from voice.agent.blocks import ToolCall
from voice.agent.surface import AnswersQuestions, AsksClient, ReadsAnswers, Surface
from voice.agent.loop_settings import ToolServices
from voice.agent.tools.base import Tool
from voice.agent.turn_rows import Place
from voice.agent.turn_state import TurnState
from voice.log import events as ev
from voice.log.events import UNSET
from voice.log.store import EventStore


class Questions:
    """The questions a turn asks the person, and whether one waits for them
    now (`waiting_for_person`: their words are then the answer, not a
    barge-in, once the question has played)."""

    def __init__(self, store: EventStore, surface: Surface, services: ToolServices):
        self.store = store
        self.surface = surface
        self.services = services  # its approvals: the grants, and where a spoken answer goes
        self.waiting_for_person = False

    def _answers_in_words(self) -> bool:
        return isinstance(self.surface, AnswersQuestions) and self.surface.answers_questions

    def withdraw_restarted(self, state: TurnState, asked: ev.ApprovalRequested) -> None:
        """The question a restart left unanswered is withdrawn (`how`
        restart) where it was asked: the turn asks it again."""
        for e in self.store.events(None, types={ev.APPROVAL_REQUESTED}):
            if isinstance(e.body, ev.ApprovalRequested) and e.body.approval_id == asked.approval_id:
                state.asked_again_ago = ago(time.time() - e.at_wall)
                record_answer(self.store, e, asked.approval_id, Answer(WITHDRAWN, "restart"))
                break

    async def ask(self, place: Place, state: TurnState, call: ToolCall, tool: Tool, args: dict[str, Any],
                  key: tuple[str, str]) -> Answer:
        """Ask, record the question (at `place`) and its answer, and say what
        the answer was; an "always" is kept under `key` (source, name). A
        cancel (a barge-in, a stop, a shutdown) withdraws the question."""
        approvals = self.services.approvals
        asked_at = (place.conversation, place.turn, place.step, place.attempt)
        question = approval_question(tool.title or call.name, tool.source, args)
        again = state.asked_again.approval_id if state.asked_again is not None and state.step == 0 else UNSET
        if again is not UNSET:
            question = f"Before I stopped, {state.asked_again_ago}, I was asking you this. " + question
        rows.record(self.store, place, ev.ApprovalRequested(approval_id=call.id, tool=call.name, server=tool.source,
                                                            title=tool.title, arguments=args, question=question,
                                                            asked_again=again))
        try:
            answer = await self._answer(place, call, tool, args, question, key)
        except anyio.get_cancelled_exc_class():
            record_answer(self.store, asked_at, call.id, Answer(WITHDRAWN, "stopped"))
            raise
        record_answer(self.store, asked_at, call.id, answer)
        said = answer_notice(answer, *key)
        if answer.always and approvals is not None and answer.how != "always":
            try:
                approvals.grants.add(*key, allow=answer.decision == GRANTED)
            except GrantsError as exc:  # the answer still counts, once
                said = f"I couldn't remember that for next time: {exc}"
        if said and self._answers_in_words():
            await self.surface.notice(said)
        return answer

    async def _answer(self, place: Place, call: ToolCall, tool: Tool, args: dict[str, Any], question: str,
                      key: tuple[str, str]) -> Answer:
        """The person's answer: a remembered one, the client's own dialog
        (ACP), or their next words after the question."""
        approvals = self.services.approvals
        try:
            if approvals is not None and approvals.grants.allows(*key):
                return Answer(GRANTED, "always")
            if approvals is not None and approvals.grants.refuses(*key):
                return Answer(DENIED, "always")
        except GrantsError:
            pass  # an unreadable grants file grants nothing: the person is asked
        if isinstance(self.surface, AsksClient):
            return await self.surface.ask_permission(call, tool, args, question)
        if approvals is None or not self._answers_in_words():
            return Answer(DENIED, "unavailable")
        assert place.turn is not None
        pending = Pending(call.id, place.conversation, place.turn, question)
        self.waiting_for_person = True
        try:
            await self.surface.notice(question)
            return await self._wait_answer(approvals, pending)
        finally:
            self.waiting_for_person = False

    async def _wait_answer(self, approvals: Approvals, pending: Pending) -> Answer:
        """A spoken answer is routed to `approvals` by the voice session; a
        surface that reads its answers itself (the terminal) is read here."""
        read = self.surface.read_answer if isinstance(self.surface, ReadsAnswers) else None
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
