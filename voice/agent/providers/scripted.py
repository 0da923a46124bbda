"""The scripted provider: streams prepared replies with timing, for tests
and demos. It runs the same code path as a real provider (the loop cannot
tell them apart) and records every request it was sent.

Script format (TOML), one `[[reply]]` per model request, in order:

    [[reply]]
    chunk_delay_ms = 80       # pause between deltas
    reasoning = "optional, streamed before the text"
    text = "First point. Second point."   # streamed word by word
    error_after_chars = 0     # fail the stream after this many text chars (0 = never)
    finish = "stop"           # optional; "" ends the stream without a finish reason
    [[reply.tool_calls]]
    name = "get_time"
    arguments = {}            # or the JSON text of an object, as a model streams it
    # text_after_tools = "Done."   # optional: streamed after the tool calls
    # at_s = 8.7              # optional: the first delta no sooner than this second of the
    #                         # session's audio clock (a recorded session's timing; see `clock`)
    # message = "1.0.0"       # optional: the request it answers, TURN.STEP.ATTEMPT (a recorded
    #                         # session writes it; a scenario's [[play]] names it)

When the script runs out, the provider raises ProviderError: a test that
asks more of the model than it scripted fails loudly.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from voice.agent.providers.base import (
    Delta,
    Finish,
    ModelRequest,
    ProviderError,
    ProviderRoute,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from voice.toml_file import read_toml

_REPLY_KEYS = {"chunk_delay_ms", "reasoning", "text", "error_after_chars", "finish", "tool_calls", "first_delay_ms",
               "text_after_tools", "at_s", "message"}
MESSAGE_ID = re.compile(r"[1-9][0-9]*\.[0-9]+\.[0-9]+")  # TURN.STEP.ATTEMPT, as a replay numbers its requests


@dataclass(frozen=True)
class ScriptedToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ScriptedReply:
    text: str = ""
    reasoning: str = ""
    chunk_delay_ms: float = 80.0
    first_delay_ms: float = 0.0
    error_after_chars: int = 0
    finish: str | None = None  # None: "tool_calls" if there are calls, else "stop"
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    text_after_tools: str = ""
    at_s: float | None = None
    message: str | None = None  # the request it answers (TURN.STEP.ATTEMPT): what a scenario's [[play]] names


def split_words(text: str) -> list[str]:
    """Split into word pieces that concatenate back to `text` exactly; each
    piece carries its leading whitespace ("First", " point.", ...)."""
    pieces = re.findall(r"\s*\S+", text)
    rest = text[len("".join(pieces)):]
    if rest:
        pieces.append(rest)
    return pieces


DAY_S = 86_400.0  # no time in a scripted reply or a scenario is longer than this


def checked_number(where: str, value: Any, low: float, high: float) -> float:
    """A number from a scripted file or a scenario: a real number (not text,
    not a bool), finite, within [low, high]; else a one-line error naming
    `where` (the file and the key)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{where} = {value!r}: a number from {low:g} to {high:g}")
    return float(value)


def _words(where: str, key: str, value: Any) -> str:
    """A text key of a reply: a TOML string. A bare number or true would be
    spoken as written, so it is an error with the quoted form as the fix."""
    if not isinstance(value, str):
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        raise ValueError(f"{where} {key} = {shown} must be a quoted string: write {key} = {json.dumps(shown)}")
    return value


def parse_replies(raw: list[Any], where: str) -> list[ScriptedReply]:
    replies = []
    for n, item in enumerate(raw, 1):
        if not isinstance(item, dict):
            raise ValueError(f"{where}: reply {n} must be a table")
        unknown = set(item) - _REPLY_KEYS
        if unknown:
            raise ValueError(f"{where}: reply {n} has unknown key(s) {sorted(unknown)}; allowed: {sorted(_REPLY_KEYS)}")
        calls = []
        for call in item.get("tool_calls", []):
            if not isinstance(call, dict) or "name" not in call:
                raise ValueError(f"{where}: reply {n}: each tool call needs a name")
            _words(f"{where}: reply {n} tool call", "name", call["name"])
            args = call.get("arguments", {})
            if isinstance(args, str):  # JSON text, as a recorded stream has it (TOML has no null)
                try:
                    args = json.loads(args)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{where}: reply {n}: tool call arguments are not JSON ({exc})") from None
            if not isinstance(args, dict):
                raise ValueError(f"{where}: reply {n}: tool call arguments must be a table")
            calls.append(ScriptedToolCall(call["name"], args))
        text = {key: _words(f"{where}: reply {n}", key, item.get(key, ""))
                for key in ("text", "reasoning", "text_after_tools")}
        if "finish" in item:
            _words(f"{where}: reply {n}", "finish", item["finish"])
        message = _words(f"{where}: reply {n}", "message", item["message"]) if "message" in item else None
        if message is not None and not MESSAGE_ID.fullmatch(message):
            raise ValueError(f"{where}: reply {n} message = {json.dumps(message)} must be TURN.STEP.ATTEMPT, "
                             'e.g. message = "1.0.0"')
        replies.append(
            ScriptedReply(
                text=text["text"],
                reasoning=text["reasoning"],
                chunk_delay_ms=checked_number(f"{where}: reply {n} chunk_delay_ms", item.get("chunk_delay_ms", 80),
                                              0, 60_000),
                first_delay_ms=checked_number(f"{where}: reply {n} first_delay_ms", item.get("first_delay_ms", 0),
                                              0, 3_600_000),
                error_after_chars=int(checked_number(f"{where}: reply {n} error_after_chars",
                                                     item.get("error_after_chars", 0), 0, 10**9)),
                finish=item.get("finish"),
                tool_calls=tuple(calls),
                text_after_tools=text["text_after_tools"],
                at_s=checked_number(f"{where}: reply {n} at_s", item["at_s"], 0, DAY_S) if "at_s" in item else None,
                message=message,
            )
        )
    return replies


def load_script(path: str | Path) -> list[ScriptedReply]:
    path = Path(path)
    data = read_toml(path, "scripted LLM file")
    if "reply" not in data or not isinstance(data["reply"], list):
        raise ValueError(f"scripted LLM file {path} has no [[reply]] entries")
    return parse_replies(data["reply"], str(path))


@dataclass
class ScriptedProvider:
    replies: list[ScriptedReply]
    name: str = "scripted"
    # Every request asked, in order, unless `on_request` takes them: a long replay
    # hands each to a file as it comes (voice.service.requests_file) instead of
    # holding hundreds of whole message windows (benchmarks/replay_memory.py).
    requests: list[ModelRequest] = field(default_factory=list)
    on_request: Callable[[ModelRequest], None] | None = None
    asked: int = 0  # requests asked so far, kept or not
    # Seconds on the session's clock, for `at_s`: the replay device's audio
    # position (voice.service.replay); else the time since this provider was made.
    clock: Callable[[], float] | None = None
    route: ProviderRoute = field(init=False)

    def __post_init__(self) -> None:
        self.route = ProviderRoute(provider="scripted", model=self.name)
        if self.clock is None:
            made = time.monotonic()
            self.clock = lambda: time.monotonic() - made

    @classmethod
    def from_file(cls, path: str | Path) -> "ScriptedProvider":
        return cls(load_script(path), name=Path(path).name)

    async def stream(self, request: ModelRequest) -> AsyncIterator[Delta]:
        self.asked += 1
        if self.on_request is not None:
            self.on_request(request)
        else:
            self.requests.append(request)
        if self.asked > len(self.replies):
            raise ProviderError(
                f"the scripted LLM has {len(self.replies)} replies and was asked for request {self.asked}",
                retryable=False,
            )
        reply = self.replies[self.asked - 1]
        delay = reply.chunk_delay_ms / 1000
        if reply.at_s is not None:  # the clock runs with time: sleep until it is there
            while (due := reply.at_s - self.clock()) > 0:
                await anyio.sleep(due)
        if reply.first_delay_ms:
            await anyio.sleep(reply.first_delay_ms / 1000)
        for piece in split_words(reply.reasoning):
            yield ReasoningDelta(piece)
            await anyio.sleep(delay)
        sent = 0
        for piece in split_words(reply.text):
            if reply.error_after_chars and sent + len(piece) > reply.error_after_chars:
                raise ProviderError(f"scripted stream error after {sent} characters")
            yield TextDelta(piece)
            sent += len(piece)
            await anyio.sleep(delay)
        for index, call in enumerate(reply.tool_calls):
            yield ToolCallDelta(index=index, id=f"call_{self.asked}_{index}", name=call.name)
            await anyio.sleep(delay)
            yield ToolCallDelta(index=index, arguments=json.dumps(call.arguments))
            await anyio.sleep(delay)
        for piece in split_words(reply.text_after_tools):
            yield TextDelta(piece)
            await anyio.sleep(delay)
        finish = reply.finish if reply.finish is not None else ("tool_calls" if reply.tool_calls else "stop")
        if not finish:
            raise ProviderError("stream ended without a finish reason")
        yield Finish(finish)

    async def aclose(self) -> None:
        return None
