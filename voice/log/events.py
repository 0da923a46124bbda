"""The event vocabulary of the durable log (docs/ARCHITECTURE.md, "The log"). Imports nothing of ours.

Every row of the log is one `Event`: ids, times, a `type` and a JSON
`payload`. Each type has one frozen dataclass here, its *body*, whose fields
are the payload's keys (`TurnEnd(outcome="aborted")` is the payload
`{"outcome": "aborted"}`). Writers record bodies (`EventStore.record`);
readers get them back with `event.body` (`parse(event)`), tolerant of rows
that earlier versions wrote: a key such a row lacks reads as the field's
default, a key no field names is ignored.

A field made with `optional()` is written only when its writer gives it
(null included): a body knows which of those it was given, so each kind of
row keeps exactly the keys it always had (an interrupted message's
`finish_reason: null`, no `finish_reason` at all on text released after a
receipt). Read back, an absent one holds its default. Where a meaning has
fixed words (a call the turn never ran, a result recovery
closed), the body has one constructor for it, used by every writer.

The three *surface* types are the only ones model history is derived from;
`speech/played` amends an assistant message with how much of it the person
actually heard. docs/ARCHITECTURE.md ("The log: every event") is the table of every type, its fields and
its writers (tests/test_events_doc.py keeps it true).
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Final, Self

# -- payload values that are plain JSON ---------------------------------------

Route = dict[str, Any]  # {"provider", "model", "base_url"}: where a model request went
ContentBlock = dict[str, Any]  # {"type": "text" | "reasoning", "text"}
TimedDelta = list[Any]  # [offset_ms, kind, data]: one delta of the provider stream as it came
OpenAIToolCall = dict[str, Any]  # {"id", "type": "function", "function": {"name", "arguments"}}

_OPTIONAL = "optional"


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()  # an optional field its writer did not give (constructors take it too)


def optional(default: Any = None) -> Any:
    """A field whose key is written only when its writer gives it (null
    included); not given, or absent from a row read back, it holds
    `default`."""
    return field(default=UNSET, metadata={_OPTIONAL: True, "absent": default})


def blocks_text(content: list[ContentBlock]) -> str:
    """The text of content blocks (reasoning left out)."""
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


# -- bodies --------------------------------------------------------------------

BODIES: dict[str, type[Body]] = {}


@dataclass(frozen=True, kw_only=True)
class Body:
    """A payload with its type. Subclasses set `TYPE` (and `DURABLE` /
    `SURFACE` where it applies) and are registered by it."""

    TYPE: ClassVar[str] = ""
    # Committed with an fsync (synchronous=FULL): an effect in the world
    # starts only once its dispatch (and so every event before it) is on
    # disk, and what is known of it afterwards survives an OS crash too.
    DURABLE: ClassVar[bool] = False
    SURFACE: ClassVar[bool] = False  # model history is derived from it

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.TYPE:
            return  # a base of several bodies
        if cls.TYPE in BODIES:
            raise TypeError(f"two bodies for the event type {cls.TYPE!r}")
        BODIES[cls.TYPE] = cls

    def __post_init__(self) -> None:
        given = set()
        for name, absent in _shape(type(self)).optional:
            if getattr(self, name) is UNSET:
                object.__setattr__(self, name, absent)
            else:
                given.add(name)
        self.__dict__["_given"] = frozenset(given)  # (not a field: equality ignores it)

    def given(self, name: str) -> bool:
        """Whether the field `name` is in the row: always for a plain field;
        for an `optional()` one, whether its writer gave it (null included)."""
        optional_ = dict(_shape(type(self)).fields)[name]
        return not optional_ or name in self.__dict__["_given"]

    def payload(self) -> dict[str, Any]:
        given = self.__dict__["_given"]
        return {name: getattr(self, name) for name, optional_ in _shape(type(self)).fields
                if not optional_ or name in given}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Self:
        shape = _shape(cls)
        if not shape.required.issubset(payload):
            missing = ", ".join(n for n, _ in shape.fields if n in shape.required and n not in payload)
            raise ValueError(f"a {cls.TYPE} payload lacks {missing}: {payload}")
        return cls(**{k: v for k, v in payload.items() if k in shape.names})


@dataclass(frozen=True)
class _Shape:
    fields: tuple[tuple[str, bool], ...]  # (name, optional) in order
    optional: tuple[tuple[str, Any], ...]  # (name, value when absent)
    names: frozenset[str]
    required: frozenset[str]  # no default: a payload without it is refused


_SHAPES: dict[type[Body], _Shape] = {}


def _shape(cls: type[Body]) -> _Shape:
    """A body's fields, looked up once (every row read back passes here)."""
    shape = _SHAPES.get(cls)
    if shape is None:
        all_ = fields(cls)
        shape = _SHAPES[cls] = _Shape(
            tuple((f.name, bool(f.metadata.get(_OPTIONAL))) for f in all_),
            tuple((f.name, f.metadata["absent"]) for f in all_ if f.metadata.get(_OPTIONAL)),
            frozenset(f.name for f in all_),
            frozenset(f.name for f in all_ if f.default is MISSING and f.default_factory is MISSING))
    return shape


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
    reason: str = ""  # empty | error | aborted | withheld | crashed
    receipts: list[str] | None = optional()  # withheld: what the writes' receipts said


@dataclass(frozen=True, kw_only=True)
class RequestError(Body):
    """A provider request failed (recorded after its `assistant/attempt`)."""

    TYPE = "agent/request-error"
    message: str
    status: int | None = None  # the HTTP status, where there was one
    retryable: bool = True


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
class SpeechPlayed(Body):
    """How much of an assistant message the person heard."""

    TYPE = "speech/played"
    message_id: str
    chars: int = 0
    words: int = 0
    samples: int = 0
    complete: bool = False


@dataclass(frozen=True, kw_only=True)
class SpeechPaused(Body):
    """Speech began while the assistant talked: its output paused (not yet a stop)."""

    TYPE = "speech/paused"
    onset: int  # the microphone sample where the speech began
    at: int | None = optional()  # the speaker position where the output paused


@dataclass(frozen=True, kw_only=True)
class SpeechResumed(Body):
    """It was not a barge-in (a backchannel, a cough, its own echo): playback went on."""

    TYPE = "speech/resumed"
    onset: int
    reason: str | None = None
    at: int | None = optional()  # the speaker position where the output went on


@dataclass(frozen=True, kw_only=True)
class SpeechConfirmed(Body):
    """The pause was a barge-in after all: the turn is cut."""

    TYPE = "speech/confirmed"
    onset: int  # mic position where the speech began
    at: int  # mic position where it was decided
    reason: str | None = None  # "voiced speech", or the words that decided


@dataclass(frozen=True, kw_only=True)
class SpeechCleared(Body):
    """What was queued for the speaker was dropped (the cut)."""

    TYPE = "speech/cleared"
    at: int  # speaker position of the clear
    onset: int | None = None  # the barge-in's onset; null for `voice ctl cancel` or a late stop


@dataclass(frozen=True, kw_only=True)
class SpeechSentence(Body):
    """One synthesized sentence of an assistant message and where it played,
    written once the message is settled or stopped: what `voice show`
    places the reply's words by. Positions are speaker samples."""

    TYPE = "speech/sentence"
    message_id: str
    index: int
    char_start: int  # offsets in the message's own text (the model's, before the speakable form)
    char_end: int
    start: int | None  # speaker position of its first sample; null: never handed over
    length: int  # samples
    handed: int  # samples handed to the device
    method: str  # how word times were found (alignments, estimate, failed)
    words: list[list[int]] = field(default_factory=list)  # [char_start, char_end, start, end]: sentence samples


@dataclass(frozen=True, kw_only=True)
class AudioClock(Body):
    """The device's sample positions now: pairs the log's `at_mono` with the
    sample clock of the microphone and the speaker (and so a recording)."""

    TYPE = "audio/clock"
    mic: int  # mic samples at 16 kHz since the device started
    speaker: int  # speaker samples since the device started
    speaker_rate: int
    output_latency: int  # speaker samples handed over and not yet heard


@dataclass(frozen=True, kw_only=True)
class ListenSpeech(Body):
    """One stretch of speech the VAD heard (mic positions), written when it ended."""

    TYPE = "listen/speech"
    start: int  # the onset
    end: int  # the end of its last voiced block
    decided: int | None  # where the end of the utterance was decided (null: it was cut short)
    for_assistant: bool  # the listen gate passed it on


@dataclass(frozen=True, kw_only=True)
class ListenWake(Body):
    """The wake word was heard."""

    TYPE = "listen/wake"
    position: int  # mic position
    model: str


@dataclass(frozen=True, kw_only=True)
class LateOutput(Body):
    """Output of a stopped or superseded unit that arrived late and was dropped."""

    TYPE = "late/output"
    kind: str  # tts-text | tts-audio | tts-failed | timer | ...
    message_id: str | None = optional()
    sentence: int | None = optional()
    samples: int | None = optional()
    error: str | None = optional()
    timer_id: str | None = optional()
    tool_call_id: str | None = optional()  # mcp-result: the call whose result came after it was cancelled
    server: str | None = optional()  # mcp-result: the MCP server that sent it


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


class DamagedEvent(ValueError):
    """A row this program cannot read: its payload is not a JSON object, lacks
    a required key, or has a type this program does not know. Only a change
    made outside voice does that (the log is append-only)."""

    def __init__(self, seq: int, type_: str, why: str):
        super().__init__(f"the log has a damaged row: event {seq} ({type_}) {why}; it was changed outside voice: "
                         "restore it from a backup, or give another log with --db")
        self.seq = seq


def parse(event: Event) -> Body:
    """The typed body of a row. Raises DamagedEvent for a type this program
    does not know or a payload without a required key."""
    kind = BODIES.get(event.type)
    if kind is None:
        raise DamagedEvent(event.seq, event.type, "has a type this program does not know")
    try:
        return kind.from_payload(event.payload)
    except (ValueError, TypeError) as exc:
        raise DamagedEvent(event.seq, event.type, f"cannot be read: {exc}") from None


def check_readable(events: list[Event]) -> None:
    """Parse every row's body now (kept on the row, `event.body`): so a row
    damaged outside voice is said in one line before anything is drawn or
    written, not halfway through."""
    for event in events:
        event.body  # (parsed once: kept on the row for the reader)


# -- the type strings, for filters and older call sites ----------------------

TURN_START: Final = TurnStart.TYPE
USER_MESSAGE: Final = UserMessage.TYPE
USER_STOP: Final = UserStop.TYPE
STEP_START: Final = StepStart.TYPE
STEP_END: Final = StepEnd.TYPE
ASSISTANT_STREAM: Final = AssistantStream.TYPE
ASSISTANT_MESSAGE: Final = AssistantMessage.TYPE
ASSISTANT_ATTEMPT: Final = AssistantAttempt.TYPE
REQUEST_ERROR: Final = RequestError.TYPE
TOOL_CALL: Final = ToolCalled.TYPE
TOOL_DISPATCH: Final = ToolDispatched.TYPE
TOOL_RESULT: Final = ToolResult.TYPE
EFFECT_RECEIPT: Final = EffectReceipt.TYPE
SPEECH_PLAYED: Final = SpeechPlayed.TYPE
SPEECH_PAUSED: Final = SpeechPaused.TYPE
SPEECH_RESUMED: Final = SpeechResumed.TYPE
SPEECH_CONFIRMED: Final = SpeechConfirmed.TYPE
SPEECH_CLEARED: Final = SpeechCleared.TYPE
SPEECH_SENTENCE: Final = SpeechSentence.TYPE
AUDIO_CLOCK: Final = AudioClock.TYPE
LISTEN_SPEECH: Final = ListenSpeech.TYPE
LISTEN_WAKE: Final = ListenWake.TYPE
LATE_OUTPUT: Final = LateOutput.TYPE
CONVERSATION_FORK: Final = ConversationFork.TYPE
CONVERSATION_END: Final = ConversationEnd.TYPE
CONVERSATION_SUMMARY: Final = ConversationSummary.TYPE
ACP_SESSION: Final = AcpSession.TYPE
TIMER_SET: Final = TimerSet.TYPE
TIMER_CANCEL: Final = TimerCancel.TYPE
TIMER_FIRED: Final = TimerFired.TYPE
RECOVERY: Final = RuntimeRecovery.TYPE
TURN_END: Final = TurnEnd.TYPE
APPROVAL_REQUESTED: Final = ApprovalRequested.TYPE
APPROVAL_ANSWERED: Final = ApprovalAnswered.TYPE

EVENT_TYPES: Final = frozenset(BODIES)
SURFACE_TYPES: Final = frozenset(t for t, b in BODIES.items() if b.SURFACE)
DURABLE_TYPES: Final = frozenset(t for t, b in BODIES.items() if b.DURABLE)

# turn/end outcomes
COMPLETED: Final = "completed"
ABORTED: Final = "aborted"  # the person stopped it
INTERRUPTED: Final = "interrupted"  # crash or shutdown
ERROR: Final = "error"
TURN_OUTCOMES: Final = frozenset({COMPLETED, ABORTED, INTERRUPTED, ERROR})

# tool/result statuses
ABORTED_BEFORE_DISPATCH: Final = "ABORTED_BEFORE_DISPATCH"
BLOCKED: Final = "blocked"  # would repeat a write whose outcome is unknown
DECLINED: Final = "declined"  # the person was asked first and did not say yes

# effect/receipt: `state` confirmed | failed | unknown; `phase` "dispatch" (the
# call's own outcome) or "reconciled" (looked up later). One of each per call.
CONFIRMED: Final = "confirmed"
FAILED: Final = "failed"
UNKNOWN: Final = "unknown"


# -- rows ----------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One row of the log, as read back."""

    seq: int
    conversation: str
    turn: int | None
    step: int | None
    attempt: int | None
    type: str
    payload: dict[str, Any]
    at_mono: float
    at_wall: float

    @property
    def body(self) -> Body:
        """The payload, typed (see `parse`); parsed once per row."""
        body = self.__dict__.get("_body")
        if body is None:
            body = self.__dict__["_body"] = parse(self)
        return body

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "conversation": self.conversation,
            "turn": self.turn,
            "step": self.step,
            "attempt": self.attempt,
            "type": self.type,
            "payload": self.payload,
            "at_mono": self.at_mono,
            "at_wall": self.at_wall,
        }


def encode_payload(payload: dict[str, Any]) -> str:
    """JSON with no NaN and no silent coercion: a payload that is not plain
    JSON (or text that is not valid Unicode, such as a lone surrogate, which
    SQLite cannot store as UTF-8) is a bug at the caller, reported before
    anything is written."""
    try:
        text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        text.encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise ValueError(f"event payload is not JSON-serialisable: {exc}") from exc
    return text
