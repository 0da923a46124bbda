"""The skills provider: the embedded default that acts with no language model.

Same streaming interface as a real provider (tool calls as ToolCallDeltas,
text word by word, then Finish). It answers the LAST user message; case and
punctuation are ignored, numbers may be digits or words ("ten", "twenty
five", "a minute", "an hour", "half a minute", "a minute and a half", "1 hour
and 30 minutes"), and "please" / "can you" / "hey" may come first:

- "what time is it", "what's the time", "time", "what's the date" -> get_time
- "set a timer for N seconds|minutes|hours", "a ten minute timer", labelled
  "called/named pasta", "for pasta for ...", "a pasta timer for ..."
  -> set_timer {"seconds", "label"?} + "Done, your timer for ... is set."
- "cancel|stop|delete the timer", "cancel my pasta timer" -> cancel_timer
- "list timers", "what timers do I have", "how long is left on my timer" -> list_timers
- "add a note: TEXT", "note TEXT", "take a note TEXT", "remember TEXT"
  -> add_note {"text": TEXT as said} + "Done, I saved the note."
- "read my notes", "what are my notes" -> read_notes
- "run NAME", "start NAME" -> run_command {"name": "name_with_underscores"}
- "what did you just say", "repeat that" -> the last assistant text heard
- "help", "what can you do" -> the skills; anything else -> a short spoken HINT
  that a language model is needed (where to set one up is printed at start-up).

A tool is called only if the request offers it, else the reply says the
skill is unavailable. A write's confirmation follows its call in the same
stream: the loop holds it until the write's receipt confirms it.

After tool results (possibly followed by that released confirmation) the
reply reads them out: the time, the timers, the notes, or plainly why a call
did not work; a confirmed write gets no further text. Results are read from
their structured form (`ModelRequest.tool_results`: status, receipt,
content), never from the text rendered for a model.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import anyio
from num2words import num2words

from voice.agent.providers.base import Delta, Finish, ModelRequest, ProviderRoute, TextDelta, ToolCallDelta
from voice.agent.providers.scripted import split_words
from voice.agent.timer_service import join_words as _join, spoken_duration
from voice.log import events as ev
from voice.log.events import ToolResult

# Spoken, so short and plain: no paths, keys or markup. Where to set up a
# language model is printed once at start-up (voice.agent.providers.open_provider).
HINT = "Sorry, I need a language model for that. Without one I do timers, notes and the time."
# Writes whose confirmation text is streamed right after the call.
CONFIRMED_WRITES = {"set_timer", "cancel_timer", "add_note", "run_command"}
_NO_TIMERS, _NO_NOTES = "Timers are not available right now.", "Notes are not available right now."
SKILLS = {  # tool: (what doing it is called, what to say when the request lacks the tool)
    "get_time": ("getting the time", "Telling the time is not available right now."),
    "set_timer": ("setting the timer", _NO_TIMERS), "cancel_timer": ("cancelling the timer", _NO_TIMERS),
    "list_timers": ("listing the timers", _NO_TIMERS), "add_note": ("saving the note", _NO_NOTES),
    "read_notes": ("reading the notes", _NO_NOTES), "run_command": ("running the command", "Commands are not configured."),
}

_SMALL = {w: n for n, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * n for n, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)}
_UNITS = {"second": 1, "seconds": 1, "sec": 1, "secs": 1, "minute": 60, "minutes": 60, "min": 60, "mins": 60,
          "hour": 3600, "hours": 3600, "hr": 3600, "hrs": 3600}
_POLITE = r"(?:(?:please|hey|ok(?:ay)?|so|um+|uh+|(?:can|could|would|will) you)[\s,]+)*"
_NOTE = re.compile(
    rf"^\W*{_POLITE}(?:(?:add|take|make|write|save)\s+(?:(?:a|an|the)\s+)?note(?:\s+(?:that|saying))?"
    rf"|note(?:\s+(?:that|down))?|remember(?:\s+that)?)\b(?P<text>.*)$", re.I | re.S)
_FILLER = {"a", "an", "the", "my", "me", "please", "for", "and", "timer", "timers", "of", "on", "to", "set",
           "start", "create", "make", "put", "cancel", "stop", "delete", "remove", "clear", "called", "named"}
_REPEAT = re.compile(r"\bwhat did you (just )?say\b|\brepeat (that|yourself|it)\b|\bsay (that|it) again\b"
                     r"|^(repeat|come again|pardon)$")
_SET_VERBS = {"set", "start", "create", "make", "put"}
_CANCEL_VERBS = {"cancel", "stop", "delete", "remove", "clear"}
_LABEL_WORDS = {"called", "named", "labelled", "labeled"}


def _tokens(text: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?|[a-z]+", text.lower().replace("'", "").replace("\u2019", ""))


def _number(tok: list[str], i: int) -> tuple[float | None, int]:
    """A number starting at tok[i] (digits, words, "a"/"an") and where it ends."""
    if re.fullmatch(r"\d+(?:\.\d+)?", tok[i]):
        return float(tok[i]), i + 1
    if tok[i:i + 3] == ["a", "couple", "of"]:
        return 2.0, i + 3
    value, j = None, i
    if tok[i] in ("a", "an"):
        value, j = 1.0, i + 1
        if tok[j:j + 1] != ["hundred"]:
            return value, j
    while j < len(tok):
        t = tok[j]
        if t in _SMALL or t in _TENS:
            value = (value or 0) + _SMALL.get(t, _TENS.get(t, 0))
        elif t == "hundred" and value is not None:
            value *= 100
        elif not (t == "and" and tok[j - 1:j] == ["hundred"] and value is not None):
            break
        j += 1
    return value, j


def _duration(tok: list[str]) -> tuple[int, set[int]]:
    """Total seconds of all "<number> <unit>" phrases, and the token indices they cover."""
    total, covered, i = 0.0, set(), 0
    while i < len(tok):
        start = i
        if tok[i] == "half" and tok[i + 1:i + 2] in (["a"], ["an"]) and tok[i + 2:i + 3] and tok[i + 2] in _UNITS:
            value, j = 0.5, i + 2
        else:
            value, j = _number(tok, i)
            if value is not None and tok[j:j + 3] == ["and", "a", "half"]:
                value, j = value + 0.5, j + 3
        if value is None or j >= len(tok) or tok[j] not in _UNITS:
            i += 1
            continue
        unit, j = _UNITS[tok[j]], j + 1
        if tok[j:j + 3] == ["and", "a", "half"]:
            value, j = value + 0.5, j + 3
        total += value * unit
        covered.update(range(start, j))
        i = j
    return round(total), covered


def _label(tok: list[str], covered: set[int], verbs: set[str]) -> str | None:
    """A timer's label: after "called/named", after a "for" that is no duration,
    or between the verb and "timer" ("my pasta timer")."""
    def words(idx: range | list[int]) -> str | None:
        out = []
        for k in idx:
            if out and (k in covered or tok[k] in ("for", "and")):
                break
            if k not in covered and tok[k] not in _FILLER:
                out.append(tok[k])
        return " ".join(out) or None

    for k, t in enumerate(tok):
        if t in _LABEL_WORDS:
            return words(range(k + 1, len(tok)))
    for k, t in enumerate(tok):
        if t == "for" and k + 1 < len(tok) and k + 1 not in covered and tok[k + 1] not in ("a", "an"):
            if (found := words(range(k + 1, len(tok)))):
                return found
    if "timer" in tok:
        first = next((k for k, t in enumerate(tok) if t in verbs), -1)
        return words(range(first + 1, tok.index("timer")))
    return None


def _strip_polite(tok: list[str]) -> list[str]:
    while tok and (tok[0] in ("please", "hey", "ok", "okay", "so", "um", "uh")
                   or (tok[0] in ("can", "could", "would", "will") and tok[1:2] == ["you"])):
        tok = tok[2:] if tok[1:2] == ["you"] else tok[1:]
    return tok[:-1] if tok[-1:] == ["please"] else tok


def _content(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        content = "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content)


class SkillsProvider:
    """Timers, notes, the time and configured commands, with no language model."""

    def __init__(self, chunk_delay_s: float = 0.02):
        self.chunk_delay_s = chunk_delay_s
        self.route = ProviderRoute(provider="skills", model="builtin")
        self._calls = 0

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ModelRequest) -> AsyncIterator[Delta]:
        messages = list(request.messages)
        # A write's confirmation, released after its receipt, may follow the
        # results: those results are still what is to be answered.
        k = len(messages)
        while k > 0 and messages[k - 1].get("role") == "assistant" and not messages[k - 1].get("tool_calls"):
            k -= 1
        calls: list[tuple[str, dict[str, Any]]] = []
        text = ""
        if k and messages[k - 1].get("role") == "tool":
            text = self._read_results(messages[:k], request.tool_results)
        elif k == len(messages) and messages and messages[-1].get("role") == "user":
            available = {t.get("function", {}).get("name") for t in request.tools}
            calls, text = self._answer(_content(messages[-1]), messages[:-1], available)
        for index, (name, args) in enumerate(calls):
            self._calls += 1
            yield ToolCallDelta(index, id=f"skill_{self._calls}", name=name, arguments=json.dumps(args))
            await anyio.sleep(self.chunk_delay_s)
        for piece in split_words(text):
            yield TextDelta(piece)
            await anyio.sleep(self.chunk_delay_s)
        yield Finish("tool_calls" if calls else "stop")

    # -- a user message -----------------------------------------------------

    def _answer(self, text: str, history: Sequence[dict[str, Any]], available: set[str]
                ) -> tuple[list[tuple[str, dict[str, Any]]], str]:
        def call(name: str, args: dict[str, Any], then: str = "") -> tuple[list[tuple[str, dict[str, Any]]], str]:
            return ([(name, args)], then) if name in available else ([], SKILLS[name][1])

        if (note := _NOTE.match(text)) is not None:
            body = note["text"].strip().lstrip(":,;-\u2013 ").rstrip(". ").strip()
            if not body:
                return [], "What should the note say?"
            return call("add_note", {"text": body}, "Done, I saved the note.")
        tok = _strip_polite(_tokens(text))
        s = " ".join(tok)
        if _REPEAT.search(s):
            heard = (_content(m).strip() for m in reversed(history) if m.get("role") == "assistant")
            said = next((c for c in heard if c), "")
            return [], f"I said: {said}" if said else "I haven't said anything yet."
        if re.search(r"^help( me)?$|\bwhat can you do\b|\bwhat are your skills\b", s):
            return [], self._help(available)
        if "timer" in tok or "timers" in tok:
            seconds, covered = _duration(tok)
            if _CANCEL_VERBS & set(tok):
                label = _label(tok, covered, _CANCEL_VERBS)
                return call("cancel_timer", {"label": label} if label else {}, "Done, the timer is cancelled.")
            if "timers" in tok or {"left", "remaining", "list", "show", "check", "status"} & set(tok):
                return call("list_timers", {})
            if seconds <= 0:
                return [], "How long should the timer be?"
            label = _label(tok, covered, _SET_VERBS)
            args: dict[str, Any] = {"seconds": seconds} | ({"label": label} if label else {})
            return call("set_timer", args, f"Done, your timer for {spoken_duration(seconds)} is set.")
        if "notes" in tok or ("note" in tok and {"read", "show", "list", "what", "whats"} & set(tok)):
            return call("read_notes", {})
        if "time" in tok or "date" in tok or re.search(r"\bwhat day is (it|today)\b", s):
            return call("get_time", {})
        if tok[:1] and tok[0] in ("run", "start", "launch", "execute"):
            name = [t for t in tok[1:] if t not in ("command", "script")]
            while name and name[0] in ("the", "my", "a"):
                name = name[1:]
            if not name:
                return [], "Which command should I run?"
            return call("run_command", {"name": "_".join(name)}, f"Done, {' '.join(name)} ran.")
        return [], HINT

    @staticmethod
    def _help(available: set[str]) -> str:
        skills = [phrase for names, phrase in (
            ({"set_timer", "list_timers", "cancel_timer"}, "set, list and cancel timers"),
            ({"add_note", "read_notes"}, "take and read notes"),
            ({"get_time"}, "tell you the time"),
            ({"run_command"}, "run configured commands"),
        ) if names & available] + ["repeat what I just said"]
        return f"I can {_join(skills)}."

    # -- tool results -------------------------------------------------------

    def _read_results(self, messages: Sequence[dict[str, Any]], results: Mapping[str, ToolResult]) -> str:
        """Read out the tool results that follow the last assistant message,
        from their structured form (status, receipt, content)."""
        k = len(messages)
        while k > 0 and messages[k - 1].get("role") == "tool":
            k -= 1
        names: dict[str, str] = {}
        for m in messages[:k]:  # later calls win if an id repeats
            for c in m.get("tool_calls") or []:
                names[c.get("id", "")] = (c.get("function") or {}).get("name", "")
        spoken = []
        for m in messages[k:]:
            call_id = m.get("tool_call_id", "")
            spoken.append(self._read_result(names.get(call_id, ""), results.get(call_id)))
        return " ".join(t for t in spoken if t)

    @staticmethod
    def _read_result(name: str, result: ToolResult | None) -> str:
        action = SKILLS.get(name, ("that",))[0]
        if result is None:  # a request that came without its results: claim nothing
            return f"Sorry, I could not tell what came of {action}."
        content = result.content if isinstance(result.content, str) else json.dumps(result.content, ensure_ascii=False)
        if (kind := _failure(result)) is not None:
            why = _reason(result.error or content if result.status != "ok" else content)
            if kind == ev.BLOCKED and result.blocked_outcome == ev.CONFIRMED:
                return f"I did not repeat {action}: it was already done."
            if kind == ev.BLOCKED:
                return f"I did not try {action} again, because an earlier try may or may not have worked."
            if kind == ev.UNKNOWN:
                return f"Sorry, I could not confirm {action}" + (f": {why}." if why else ".")
            if kind == ev.DECLINED:  # the answer was acknowledged where it was given ("Okay, I didn't do it.")
                return (f"Sorry, I could not ask you about {action} here, so I did not do it."
                        if "no one could be asked" in (result.error or "") else "")
            return f"Sorry, {action} did not work" + (f": {why}." if why else ".")
        if name in CONFIRMED_WRITES:
            return ""  # its confirmation was already spoken after its receipt
        try:
            data = json.loads(content)
        except ValueError:
            return f"Here is what I found: {content}"
        if isinstance(data, dict) and isinstance(data.get("spoken"), str):
            return f"It is {data['spoken']}." if name == "get_time" else data["spoken"]
        if name in ("list_timers", "read_notes"):
            key = "timers" if name == "list_timers" else "notes"
            items = data.get(key) if isinstance(data, dict) else data
            count = data.get("count") if isinstance(data, dict) else None
            if isinstance(items, list):
                return _summarise(items, key, count if isinstance(count, int) else len(items))
        return f"Here is what I found: {content}"


def _failure(result: ToolResult) -> str | None:
    """How a result failed, or None when it did what was asked: a write's
    receipt (failed, unknown) comes first, then the result's own status
    (error, cancelled, blocked, ABORTED_BEFORE_DISPATCH)."""
    if result.status == "ok":
        return result.receipt if result.receipt in (ev.FAILED, ev.UNKNOWN) else None
    if result.receipt and result.status != ev.BLOCKED:
        return result.receipt
    return result.status


def _reason(text: str) -> str:
    """A failure's reason, readable: a JSON object's reason/error/message field."""
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip().rstrip(".")
    found = [data.get(k) for k in ("reason", "error", "message")] if isinstance(data, dict) else []
    return next((str(v).rstrip(".") for v in found if v), "")


def _summarise(items: list[Any], kind: str, count: int) -> str:
    if not items:
        return f"You have no {kind}."
    head = f"You have {num2words(count)} {kind if count != 1 else kind[:-1]}: "
    if count > len(items):
        head = f"You have {num2words(count)} {kind}. The latest {num2words(len(items))}: "
    return head + _join([_describe(i, kind) for i in items]).rstrip(".") + "."


def _describe(item: Any, kind: str) -> str:
    """One timer ("the pasta timer with ten seconds left") or note (its text)."""
    if not isinstance(item, dict):
        return str(item)
    if kind == "notes":
        return str(item.get("text") or item.get("content") or json.dumps(item))
    label = item.get("label") or item.get("name")
    left = next((item[k] for k in ("remaining_s", "remaining_seconds", "remaining", "seconds_left", "seconds")
                 if isinstance(item.get(k), (int, float))), None)
    what = f"the {label} timer" if label else "a timer"
    return f"{what} with {spoken_duration(left)} left" if left is not None else what
