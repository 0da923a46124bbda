"""The bodies of a turn and its model requests: the request, its steps,
the provider's stream and what it left, the turn's end; and what belongs
to the conversation (forks, ends, summaries, ACP sessions, recovery)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from voice.log.bodies.base import UNSET, Body, ContentBlock, OpenAIToolCall, Route, TimedDelta, blocks_text, optional


@dataclass(frozen=True, kw_only=True)
class TurnStart(Body):
    """A request (spoken, typed, `voice ctl say`, ACP) opens a turn."""

    TYPE = "turn/start"
    source: str | None = optional()  # voice | text | acp | ...


@dataclass(frozen=True, kw_only=True)
class UserMessage(Body):
    """The person's words that the turn answers."""

    TYPE = "user/message"
    SURFACE = True
    content: str
    source: str | None = optional()
    # spoken turns: {"start", "end": mic positions of the utterance, "stt_ms": recognition time}
    audio: dict[str, Any] | None = optional()


@dataclass(frozen=True, kw_only=True)
class UserStop(Body):
    """What the person said that stopped the assistant and asked for nothing
    more (a stop intent, a backchannel or a sound that cut the reply): not a
    surface event, so never model history; filed under the turn it stopped
    (or none)."""

    TYPE = "user/stop"
    content: str
    source: str | None = None
    intent: str = "stop"  # stop | backchannel | sound
    stopped_turn: int | None = None


@dataclass(frozen=True, kw_only=True)
class StepStart(Body):
    """One model request and what follows from it begins."""

    TYPE = "step/start"
    route: Route | None = optional()


@dataclass(frozen=True, kw_only=True)
class StepEnd(Body):
    TYPE = "step/end"
    outcome: str  # completed | tool_calls | error | aborted | interrupted


@dataclass(frozen=True, kw_only=True)
class AssistantStream(Body):
    """The start or end frame of one provider stream."""

    TYPE = "agent/assistant-stream"
    frame: str  # start | end
    route: Route | None = optional()  # start
    finish_reason: str | None = optional()  # end, as the provider gave it
    error: str | None = optional()  # end: the request failed
    aborted: bool = optional(False)  # end: stopped (or crashed) mid-stream
    reason: str | None = optional()  # end, aborted: "crashed" when recovery closed it

    @classmethod
    def start(cls, route: Route) -> AssistantStream:
        return cls(frame="start", route=route)

    @classmethod
    def end(cls, finish_reason: str | None) -> AssistantStream:
        return cls(frame="end", finish_reason=finish_reason)

    @classmethod
    def end_failed(cls, error: str) -> AssistantStream:
        return cls(frame="end", error=error)

    @classmethod
    def end_stopped(cls, reason: str = UNSET) -> AssistantStream:
        return cls(frame="end", aborted=True, reason=reason)


@dataclass(frozen=True, kw_only=True)
class _Streamed(Body):
    """What a provider stream left: content blocks, where the request went,
    how it finished and the exact timed stream."""

    message_id: str = ""  # "turn.step.attempt", ".1" for text released after receipts
    content: list[ContentBlock] = field(default_factory=list)
    route: Route | None = optional()
    finish_reason: str | None = optional()
    stream: list[TimedDelta] | None = optional()
    # Read from an early start (voice.agent.preempt): when, on the `stream`'s offsets (ms from its start,
    # negative: before the turn was committed), its words were known (`words_ms`), its request went out
    # (`sent_ms`) and its first text came (`first_text_ms`; null: none came).
    early: dict[str, float | None] | None = optional()

    @property
    def text(self) -> str:
        return blocks_text(self.content)


@dataclass(frozen=True, kw_only=True)
class AssistantMessage(_Streamed):
    """What the assistant said (or began to say) and the calls it made: a
    streamed message (route, finish reason, the exact timed `stream`,
    `tool_calls`), the delivered prefix of a stopped one (`interrupted`,
    `surfaceOp` "append"), or text released after a write's receipt
    (`origin`, `receipts`)."""

    TYPE = "assistant/message"
    SURFACE = True
    tool_calls: list[OpenAIToolCall] | None = optional()
    interrupted: bool = optional(False)
    surfaceOp: str | None = optional()  # "append": the key as the reference design names it
    # Released after receipts: "completion" (the model's text, every write
    # confirmed), "tool" (the tools' own phrases: the model said nothing
    # after its writes), "receipt" (ours: a write was not confirmed).
    origin: str | None = optional()
    receipts: list[str] | None = optional()


@dataclass(frozen=True, kw_only=True)
class AssistantAttempt(_Streamed):
    """A stream kept for the record that adds nothing to history."""

    TYPE = "assistant/attempt"
    reason: str = ""  # empty | error | aborted | withheld | crashed | superseded | warm
    receipts: list[str] | None = optional()  # withheld: what the writes' receipts said


@dataclass(frozen=True, kw_only=True)
class RequestError(Body):
    """A provider request failed (recorded after its `assistant/attempt`)."""

    TYPE = "agent/request-error"
    message: str
    status: int | None = None  # the HTTP status, where there was one
    retryable: bool = True


@dataclass(frozen=True, kw_only=True)
class ConversationFork(Body):
    TYPE = "conversation/fork"
    parent: str
    turn: int


@dataclass(frozen=True, kw_only=True)
class ConversationEnd(Body):
    """The conversation is over: the next request opens a new one. Nothing is
    deleted; an ended conversation stays readable and forkable. Timers and
    notes are not conversation state and outlive it."""

    TYPE = "conversation/end"
    reason: str  # idle (the gap passed) | asked (the person said so) | new (`voice ctl new`)
    idle_s: float | None = optional()  # the gap that ended it (reason idle)
    words: str | None = optional()  # what the person said (reason asked)


@dataclass(frozen=True, kw_only=True)
class ConversationSummary(Body):
    """What the model wrote of turns `first_turn`..`last_turn` once they no
    longer fit the context window: requests carry it in their place."""

    TYPE = "conversation/summary"
    text: str
    first_turn: int
    last_turn: int
    route: Route | None = optional()


@dataclass(frozen=True, kw_only=True)
class AcpSession(Body):
    """An editor opened (or loaded) this conversation as an ACP session, in `cwd`."""

    TYPE = "acp/session"
    cwd: str


@dataclass(frozen=True, kw_only=True)
class RuntimeRecovery(Body):
    """What start-up recovery closed or reconciled, or what a damaged log lost."""

    TYPE = "runtime/recovery"
    closed_turns: list[int] | None = optional()
    unknown_writes: int | None = optional()
    reconciled: int | None = optional()
    log_damage: str | None = optional()
    lost_commits: int | None = optional()
    copy: str | None = optional()  # where the damaged files were kept


@dataclass(frozen=True, kw_only=True)
class TurnEnd(Body):
    """Exactly one per turn (the database refuses a second)."""

    TYPE = "turn/end"
    DURABLE = True
    outcome: str  # completed | aborted | interrupted | error
    reason: str | None = optional()
    error: str | None = optional()
