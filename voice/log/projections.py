"""Views derived from the log: model history, chat view, trajectory, forks.

Model history comes from the three surface event types only, with
`speech/played` applied so that assistant text is what the person heard.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from voice.log import events as ev
from voice.log.events import Event
from voice.log.store import EventStore, new_conversation_id


def message_text(payload: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in payload.get("content", []) if b.get("type") == "text")


def _played_by_message(events: list[Event]) -> dict[str, dict[str, Any]]:
    played: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.type == ev.SPEECH_PLAYED:
            played[e.payload["message_id"]] = e.payload
    return played


def _upto(events: list[Event], upto: int | None) -> list[Event]:
    if upto is None:
        return events
    return [e for e in events if e.turn is None or e.turn <= upto]


def _assistant_entry(e: Event, played: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """An assistant/message as model history sees it: cut to what was heard."""
    text = message_text(e.payload)
    interrupted = bool(e.payload.get("interrupted"))
    heard = played.get(e.payload.get("message_id", ""))
    if heard is not None and not heard.get("complete"):
        text = text[: heard["chars"]]
        interrupted = True
    calls = e.payload.get("tool_calls") or []
    if not text.strip() and not calls:
        return None  # nothing of it reached the person or the tools
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if interrupted:
        msg["interrupted"] = True
    if calls:
        msg["tool_calls"] = calls
    return msg


def derive_messages(store: EventStore, conversation: str, upto: int | None = None) -> list[dict[str, Any]]:
    """The model history of a conversation (up to and including turn `upto`):
    a list of {"role", "content", "interrupted"?, "tool_calls"?, "tool_call_id"?}."""
    events = _upto(store.events(conversation, types=ev.SURFACE_TYPES | {ev.SPEECH_PLAYED}), upto)
    played = _played_by_message(events)
    messages: list[dict[str, Any]] = []
    for e in events:
        if e.type == ev.USER_MESSAGE:
            messages.append({"role": "user", "content": e.payload["content"]})
        elif e.type == ev.ASSISTANT_MESSAGE:
            msg = _assistant_entry(e, played)
            if msg is not None:
                messages.append(msg)
        elif e.type == ev.TOOL_RESULT:
            messages.append({"role": "tool", "tool_call_id": e.payload["tool_call_id"], "content": tool_result_text(e.payload)})
    return messages


@dataclass(frozen=True)
class TurnReply:
    user_text: str
    generated_text: str  # everything the model streamed as text in kept attempts
    delivered_text: str  # what reached the person (and model history)
    interrupted: bool
    outcome: str | None


def turn_reply(store: EventStore, conversation: str, turn: int) -> TurnReply:
    events = store.events(conversation, turn=turn)
    played = _played_by_message(events)
    user = next((e.payload["content"] for e in events if e.type == ev.USER_MESSAGE), "")
    generated, delivered, interrupted, outcome = [], [], False, None
    for e in events:
        if e.type == ev.ASSISTANT_MESSAGE:
            generated.append("".join(d for _, kind, d in e.payload.get("stream", []) if kind == "text").strip())
            msg = _assistant_entry(e, played)
            if msg is not None and msg["content"].strip():
                delivered.append(msg["content"].strip())
            interrupted = interrupted or bool(msg and msg.get("interrupted"))
        elif e.type == ev.ASSISTANT_ATTEMPT and e.payload.get("reason") == "aborted":
            interrupted = True
        elif e.type == ev.TURN_END:
            outcome = e.payload.get("outcome")
    return TurnReply(user, " ".join(g for g in generated if g), " ".join(delivered), interrupted, outcome)


def message_line(m: dict[str, Any]) -> str:
    """One history message as a line for people: `role: content [stopped] -> tool(args)`."""
    flag = " [stopped]" if m.get("interrupted") else ""
    calls = "".join(f" -> {c['function']['name']}({c['function']['arguments']})" for c in m.get("tool_calls", []))
    return f"{m['role']}: {m['content']}{flag}{calls}"


def tool_result_text(payload: dict[str, Any]) -> str:
    status = payload.get("status")
    if status == "ok":
        content = payload.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        receipt = payload.get("receipt")  # writes: what is known of the effect
        return f"{receipt}: {text}" if receipt else text
    receipt = payload.get("receipt")
    if receipt and status != ev.BLOCKED:  # a dispatched write: what its receipt proves comes first, never "cancelled"
        return f"{receipt}: {payload.get('error', '')}".strip()
    return f"{status}: {payload.get('error') or payload.get('content') or ''}".strip()


def provider_messages(history: list[dict[str, Any]], system_prompt: str | None) -> list[dict[str, Any]]:
    """History as an OpenAI-style request: our bookkeeping keys removed."""
    out = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for m in history:
        m = {k: v for k, v in m.items() if k != "interrupted"}
        out.append(m)
    return out


# -- chat view ---------------------------------------------------------------


def chat_view(store: EventStore, conversation: str) -> list[str]:
    """What the conversation looked like to the person, a line per message.
    Interrupted assistant messages end with "[stopped]"."""
    events = store.events(conversation)
    played = _played_by_message(events)
    lines = []
    for e in events:
        if e.type == ev.USER_MESSAGE:
            lines.append(f"you: {e.payload['content']}")
        elif e.type == ev.USER_STOP and e.payload.get("intent") == "sound":
            lines.append("  (a sound stopped the reply)")
        elif e.type == ev.USER_STOP:
            lines.append(f"you: {e.payload['content']}  ({e.payload.get('intent', 'stop')}: not answered)")
        elif e.type == ev.ASSISTANT_MESSAGE:
            for block in e.payload.get("content", []):
                if block.get("type") == "reasoning":
                    lines.append(f"  (thinking) {block['text'].strip()}")
            msg = _assistant_entry(e, played)
            if msg is not None and (msg["content"].strip() or msg.get("interrupted")):
                stopped = " [stopped]" if msg.get("interrupted") else ""
                lines.append(f"assistant: {msg['content'].strip()}{stopped}")
            elif msg is None and e.payload.get("interrupted"):
                lines.append("assistant: [stopped]")
        elif e.type == ev.TOOL_RESULT:
            lines.append(f"  · {e.payload.get('name', '?')} -> {e.payload.get('status')}")
        elif e.type == ev.TIMER_FIRED:
            lines.append(f"  [timer] {e.payload.get('text', '')}")
        elif e.type == ev.TURN_END and e.payload.get("outcome") == ev.ERROR:
            lines.append(f"  [error: {e.payload.get('error', '')}]")
    return lines


# -- trajectory view -----------------------------------------------------------


@dataclass
class RequestRecord:
    """One provider request of a turn and what became of it."""

    step: int
    attempt: int
    provider: str = ""
    model: str = ""
    lifecycle: list[str] = field(default_factory=list)
    outcome: str = "streaming"  # result | interrupted | error | aborted
    result_seq: int | None = None
    error: str | None = None
    tool_calls: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def trajectory(store: EventStore, conversation: str, turn: int) -> tuple[list[RequestRecord], str | None]:
    """Each provider request of a turn with its lifecycle, and the turn's outcome."""
    records: dict[tuple[int, int], RequestRecord] = {}
    outcome = None
    for e in store.events(conversation, turn=turn):
        if e.type == ev.TURN_END:
            outcome = e.payload.get("outcome")
        if e.step is None or e.attempt is None:
            continue
        rec = records.setdefault((e.step, e.attempt), RequestRecord(e.step, e.attempt))
        route = e.payload.get("route")
        if route:
            rec.provider, rec.model = route.get("provider", ""), route.get("model", "")
        if e.type == ev.ASSISTANT_STREAM and e.payload.get("frame") == "start":
            rec.lifecycle.append("streaming")
        elif e.type == ev.ASSISTANT_MESSAGE:
            rec.outcome = "interrupted" if e.payload.get("interrupted") else "result"
            rec.result_seq = e.seq
            rec.tool_calls = [c["function"]["name"] for c in e.payload.get("tool_calls") or []]
            if rec.tool_calls:
                rec.lifecycle.append("tool calls: " + ", ".join(rec.tool_calls))
            rec.lifecycle.append(rec.outcome)
        elif e.type == ev.ASSISTANT_ATTEMPT:
            rec.outcome = e.payload.get("reason", "attempt")
            rec.result_seq = e.seq
            rec.lifecycle.append(f"attempt ({rec.outcome})")
        elif e.type == ev.REQUEST_ERROR:
            rec.outcome, rec.error = "error", e.payload.get("message")
            rec.lifecycle.append(f"error: {rec.error}")
        elif e.type == ev.TOOL_RESULT:
            rec.lifecycle.append(f"tool {e.payload.get('name')}: {e.payload.get('status')}")
        elif e.type == ev.SPEECH_PLAYED and not e.payload.get("complete"):
            rec.lifecycle.append(f"played {e.payload.get('words')} words, then stopped")
    return [records[k] for k in sorted(records)], outcome


def format_trajectory(turn: int, records: list[RequestRecord], outcome: str | None) -> str:
    lines = [f"turn {turn}: {outcome or 'open'}"]
    for r in records:
        seq = f" (seq {r.result_seq})" if r.result_seq is not None else ""
        lines.append(f"  step {r.step} attempt {r.attempt} [{r.provider}/{r.model}] " + " -> ".join(r.lifecycle) + seq)
    return "\n".join(lines)


# -- forks -------------------------------------------------------------------


def fork(store: EventStore, conversation: str, turn: int) -> str:
    """A new conversation whose log (and so its history) equals the
    original's up to and including `turn`."""
    events = store.events(conversation)
    if not any(e.turn == turn for e in events):
        raise ValueError(f"turn {turn} is not in conversation {conversation}")
    keep = [e for e in events if e.turn is not None and e.turn <= turn]
    new = new_conversation_id()
    store.copy_events(keep, new)
    store.append(new, ev.CONVERSATION_FORK, {"parent": conversation, "turn": turn})
    return new
