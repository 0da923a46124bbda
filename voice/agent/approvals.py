"""Asking the person before a call is dispatched, and remembering "always".

A call that asks first (`Tool.approval_key`: an MCP write under its
server's `approve` policy, voice.agent.mcp.tools; a configured command
under `tools.approve`, voice.agent.tools.commands; both by
`needs_approval`) is dispatched only after a grant recorded in the log.
The agent loop records `approval/requested` (durable), says the question
through its surface (`approval_question`: which tool of which
server, and the arguments that matter) and waits here for the answer:

- the person's next words (spoken: the voice session routes the utterance
  here instead of making it a request; typed: `voice chat` routes the next
  line), read by `interpret`: "yes" / "go ahead" grant, "yes, always" grants
  and remembers; "no", a stop phrase, anything else, or silence past
  `timeout_s` decline, and the model is told the person declined (with the
  words, so "no, the other one" can be acted on);
- `voice ctl approve|deny` from a terminal (`answer`);
- a barge-in, `session/cancel` or a shutdown withdraws it (the turn's cancel
  scope ends the wait): never granted, never denied;
- an editor's own dialog (ACP `session/request_permission`, through the
  surface's `ask_permission`).

The person is then told how the answer was taken (`answer_notice`).

Then `approval/answered` (durable) says which, how and with what words. A
pending approval that a crash left without an answer is asked again after
the restart (`unanswered`), in its own conversation, and only within the
conversation's idle gap (older ones are withdrawn, `expired`); never
dispatched without a new yes.

"Always" grants are keyed by the call's approval key, (server, tool) or
("tools.commands", the command's name), kept in the config folder
(`grants.json`), listed by `voice doctor` and `voice grants`, revoked with
`voice grants revoke SERVER TOOL`.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from voice.log import events as ev
from voice.log.store import EventStore
from voice.paths import config_dir

GRANTED, DENIED, WITHDRAWN = "granted", "denied", "withdrawn"
_YES = {"yes", "yeah", "yep", "yup", "sure", "go ahead", "do it", "ok", "okay", "confirm", "confirmed", "correct",
        "yes do it", "yes go ahead", "go for it", "please do", "affirmative", "alright", "all right", "approve",
        "allow", "allow it", "allow once", "yes once"}
_ALWAYS = {"always", "yes always", "always allow", "allow always", "yes always allow", "always do it",
           "yes and always", "yes from now on", "always yes"}
_FILLERS = {"please", "um", "uh", "oh", "well", "so", "hey", "thanks", "thank", "you", "nabu"}
_ARGUMENT_CHARS = 60  # of each argument's value, in a question


@dataclass(frozen=True)
class Answer:
    decision: str  # granted | denied | withdrawn
    how: str  # voice | text | ctl | acp | always (a remembered grant) | timeout | ended | unavailable | stopped
    words: str = ""
    always: bool = False


def needs_approval(policy: str, effect: str, destructive: bool) -> bool:
    """Whether a call asks first under an approval policy (an MCP server's
    `approve`, the configured commands' `tools.approve`): "writes" every
    write, "destructive" a write that may destroy or undo, "never" none."""
    return effect == "write" and (policy == "writes" or (policy == "destructive" and destructive))


def interpret(words: str) -> tuple[str, bool]:
    """(granted | denied, always) of what the person said to the question."""
    said = [w for w in re.findall(r"[a-z]+", words.lower().replace("'", "")) if w not in _FILLERS]
    text = " ".join(said)
    if text in _ALWAYS:
        return GRANTED, True
    if text in _YES:
        return GRANTED, False
    return DENIED, False


def approval_question(title: str, server: str, arguments: dict[str, Any]) -> str:
    """One short sentence made from the call, every argument in it (none
    hidden; control characters escaped, so an argument cannot draw another
    question over this one): "Should I use HassTurnOff on home, with name
    Front door? Say yes or no." """
    readable = _printable(title, 80)
    shown = [f"{_printable(key.replace('_', ' '), 40)} "
             f"{_printable(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False), _ARGUMENT_CHARS)}"
             for key, value in arguments.items()]
    where = f" on {_printable(server, 40)}" if server else ""
    with_ = (", with " + ", ".join(shown)) if shown else ""
    return f"Should I use {readable}{where}{with_}? Say yes or no."


def _printable(text: str, limit: int) -> str:
    """`text` with control characters escaped (as JSON writes them), cut to `limit`."""
    escaped = "".join(json.dumps(ch)[1:-1] if not ch.isprintable() else ch for ch in text)
    return escaped if len(escaped) <= limit else escaped[:limit] + "..."


def answer_notice(answer: Answer, server: str, tool: str) -> str:
    """What the person is told of how their answer was taken."""
    if answer.how in ("always", "unavailable", "acp"):
        return ""  # nothing was asked here, or the client showed its own dialog
    if answer.decision == GRANTED:
        return (f"Okay, doing it, and from now on without asking (voice grants revoke {server} {tool} undoes that)."
                if answer.always else "Okay, doing it.")
    if answer.how == "timeout":
        return "No answer, so I didn't do it."
    if answer.how == "ended":
        return "No answer (the input ended), so I didn't do it."
    return "Okay, I didn't do it."


def ago(seconds: float) -> str:
    """'3 minutes ago', for a question asked again."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{round(seconds)} seconds ago"
    if seconds < 5400:
        return f"{round(seconds / 60)} minutes ago"
    return f"{round(seconds / 3600)} hours ago"


class GrantsError(Exception):
    """The grants file cannot be read or written; the message names it and the fix."""


@dataclass
class Grants:
    """The person's "always" answers per (server, tool), in a JSON file:
    `always` (allowed without asking) and `never` (declined without asking:
    an editor's "always reject")."""

    path: Path = field(default_factory=lambda: config_dir() / "grants.json")

    def _read(self) -> dict[str, list[tuple[str, str]]]:
        """Raises GrantsError for a file that exists and cannot be read as
        grants: it is never written over (the grants in it stay)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError) as exc:
            raise GrantsError(f"{self.path} cannot be read ({getattr(exc, 'strerror', None) or exc}): fix or remove "
                              "it; until then every call that asks first asks each time") from None
        if not isinstance(data, dict):
            raise GrantsError(f"{self.path} is not a grants file (a JSON object): fix or remove it")
        return {kind: sorted({(p[0], p[1]) for p in data.get(kind, []) if isinstance(p, list) and len(p) == 2
                              and all(isinstance(x, str) for x in p)})
                for kind in ("always", "never")}

    def list(self, kind: str = "always") -> list[tuple[str, str]]:
        return self._read()[kind]

    def allows(self, server: str, tool: str) -> bool:
        return (server, tool) in self.list("always")

    def refuses(self, server: str, tool: str) -> bool:
        return (server, tool) in self.list("never")

    def add(self, server: str, tool: str, *, allow: bool = True) -> None:
        data = self._read()
        keep, drop = ("always", "never") if allow else ("never", "always")
        data[keep] = sorted({*data[keep], (server, tool)})
        data[drop] = [p for p in data[drop] if p != (server, tool)]
        self._write(data)

    def revoke(self, server: str, tool: str) -> bool:
        data = self._read()
        if (server, tool) not in data["always"] + data["never"]:
            return False
        self._write({kind: [p for p in pairs if p != (server, tool)] for kind, pairs in data.items()})
        return True

    def _write(self, data: dict[str, list[tuple[str, str]]]) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({kind: [list(p) for p in pairs] for kind, pairs in data.items() if pairs},
                                      indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)  # never half a file
        except OSError as exc:
            if tmp.is_file():
                tmp.unlink()
            raise GrantsError(f"{self.path} cannot be written ({exc.strerror or exc}): check that it is a file you "
                              "can write") from None


@dataclass
class Pending:
    approval_id: str
    conversation: str
    turn: int
    question: str
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: Answer | None = None


@dataclass
class Approvals:
    """The approvals waiting for an answer, for the whole app."""

    grants: Grants = field(default_factory=Grants)
    timeout_s: float = 30.0
    _pending: dict[str, Pending] = field(default_factory=dict)

    def waiting(self, conversation: str | None = None) -> list[Pending]:
        return [p for p in self._pending.values() if conversation is None or p.conversation == conversation]

    def answer(self, words: str | None = None, *, how: str, decision: str | None = None, always: bool = False,
               conversation: str | None = None) -> Pending | None:
        """Answer the newest pending approval (of `conversation`): by the
        person's `words`, or by a `decision` (ctl). Returns it, or None when
        none is waiting."""
        waiting = self.waiting(conversation)
        if not waiting:
            return None
        pending = waiting[-1]
        if decision is None:
            decision, always = interpret(words or "")
        pending.answer = Answer(decision, how, (words or "").strip(), always and decision == GRANTED)
        pending.answered.set()
        return pending

    async def wait(self, pending: Pending) -> Answer:
        """Until the person answers, or `timeout_s` passes (declined)."""
        self._pending[pending.approval_id] = pending
        try:
            with anyio.move_on_after(self.timeout_s):
                await pending.answered.wait()
        finally:
            self._pending.pop(pending.approval_id, None)
        return pending.answer or Answer(DENIED, "timeout")


def record_answer(store: EventStore, asked: ev.Event | tuple[str, int | None, int | None, int | None],
                  approval_id: str, answer: Answer) -> None:
    """The one writer of `approval/answered`: what became of the question
    `approval_id`, filed where it was asked (`asked`: its row, or
    (conversation, turn, step, attempt)). The loop (granted, denied,
    withdrawn by a stop or a restart) and the expiry below write it here."""
    where = (asked.conversation, asked.turn, asked.step, asked.attempt) if isinstance(asked, ev.Event) else asked
    conversation, turn, step, attempt = where
    store.record(conversation, ev.ApprovalAnswered(approval_id=approval_id, decision=answer.decision, how=answer.how,
                                                   words=answer.words, always=answer.always),
                 turn=turn, step=step, attempt=attempt)


def unanswered(store: EventStore, conversation: str, *, expire_s: float,
               now: float | None = None) -> list[tuple[ev.Event, ev.ApprovalRequested]]:
    """Questions of `conversation` asked and never answered (the process
    died while one was pending), oldest first: they are asked again, never
    dispatched. One asked more than `expire_s` ago (any conversation's) is
    withdrawn here instead (`how` expired): an old question out of the blue
    would take the person's next words for an answer."""
    now = time.time() if now is None else now
    asked: dict[tuple[str, str], tuple[ev.Event, ev.ApprovalRequested]] = {}
    for e in store.events(None, types={ev.APPROVAL_REQUESTED, ev.APPROVAL_ANSWERED}):
        body = e.body
        if isinstance(body, ev.ApprovalRequested):
            asked[(e.conversation, body.approval_id)] = (e, body)
        elif isinstance(body, ev.ApprovalAnswered):
            asked.pop((e.conversation, body.approval_id), None)
    out = []
    for e, body in asked.values():
        if now - e.at_wall > expire_s:
            record_answer(store, e, body.approval_id, Answer(WITHDRAWN, "expired"))
        elif e.conversation == conversation:
            out.append((e, body))
    return out
