"""How `voice ctl` shows the daemon's replies: lines for people by default,
the daemon's JSON lines with --json; and which replies are failures."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from voice.errors import Failed
from voice.log import events as ev

Show = Callable[[dict[str, Any]], None]


def as_json(reply: dict[str, Any]) -> None:
    print(json.dumps(reply, ensure_ascii=False), flush=True)


def for_people(cmd: str) -> Show:
    def show(reply: dict[str, Any]) -> None:
        if reply.get("ok") is False:
            return  # the error is the command's one line on stderr (exit_status)
        lines = _FORMATS.get(cmd, _status)(reply)
        if lines:
            print("\n".join(lines), flush=True)

    return show


def exit_status(cmd: str, first: dict[str, Any]) -> int:
    """0 when the request did what it asked; else `Failed` with the reason."""
    if first.get("ok") is not True:
        raise Failed(f"the daemon refused voice ctl {cmd}: {first.get('error', 'no reason given')}")
    if cmd == "say" and "turn" in first and first.get("outcome") != ev.COMPLETED:
        how = {ev.ABORTED: "stopped by the person", ev.INTERRUPTED: "stopped by a shutdown",
               ev.ERROR: "ended in an error (the language model failed)"}.get(first.get("outcome"), "did not complete")
        raise Failed(f"turn {first.get('turn')} {how}")
    return 0


def _status(r: dict[str, Any]) -> list[str]:
    llm = r.get("llm") or {}
    listen = r.get("listen") or {}
    model = f"{llm.get('provider')} {llm.get('model')}" + (f" at {llm['base_url']}" if llm.get("base_url") else "")
    turn = r.get("turn")
    return [
        f"state: {r.get('state')}",
        f"listening: {listen.get('mode')} ({listen.get('state')})"
        + (f', wake word "{listen["wake_word"].replace("_", " ")}"' if listen.get("wake_word") else ""),
        f"turn: {turn if turn is not None else 'none running'}",
        f"conversation: {r.get('conversation')}",
        _audio(r),
        f"speech: whisper {r.get('stt')}, {r.get('tts')}",
        f"language model: {model}",
        f"muted: {'yes' if r.get('muted') else 'no'}",
    ] + ([f"waiting for an answer: {r['question']} (voice ctl approve|deny)"] if r.get("question") else []) + (
        ["mcp servers: " + ", ".join(f"{name} {state}" for name, state in r["mcp"].items())] if r.get("mcp") else [])


def _audio(r: dict[str, Any]) -> str:
    return f"audio: {audio_state(r)}"


def audio_state(r: dict[str, Any]) -> str:
    """The daemon's sound devices, from its status: in use, lost, waited
    for, or with a muted microphone (also `voice doctor`'s)."""
    lost = r.get("audio_lost")
    muted = r.get("mic_muted")
    if lost:
        tries = f"{lost['attempts']} tries so far" + (f", the last: {lost['error']}" if lost.get("error") else "")
        if lost.get("at_start"):
            return f"waiting for a sound device for {lost['seconds']:.0f} s, retrying ({lost['reason']}; {tries})"
        return f"lost {lost['seconds']:.0f} s ago, retrying ({lost['reason']}; {tries})"
    if muted:
        return (f"{r.get('device')}; the microphone is muted: exact digital silence for {muted['seconds']:.0f} s "
                "(a mute key or switch?)")
    return str(r.get("device"))


def _say(r: dict[str, Any]) -> list[str]:
    if "turn" not in r:  # the text only asked for a new conversation
        return _new(r)
    stopped = r.get("outcome") in (ev.ABORTED, ev.INTERRUPTED)
    if r.get("not_said"):
        return [f"assistant (not said aloud): {r['not_said']}"]
    if not r.get("reply") and not stopped:
        return []  # nothing was said: the error line (exit_status) tells why
    return [" ".join(p for p in ("assistant:", r.get("reply"), "[stopped]" if stopped else "") if p)]


def _cancel(r: dict[str, Any]) -> list[str]:
    return ["stopped the turn" if r.get("cancelled") else "nothing was running"]


def _mute(r: dict[str, Any]) -> list[str]:
    return ["muted: the microphone is ignored until voice ctl unmute" if r.get("muted") else "listening again"]


def _save(r: dict[str, Any]) -> list[str]:
    turns = ", ".join(map(str, r.get("turns", []))) or "none"
    early = r.get("before_start") or []
    if early:  # the ring keeps the last [record] ring_s seconds: a longer turn's start has left it
        turns += (f"; left out: turn {', '.join(map(str, early))}, which began before the recording did "
                  "(raise [record] ring_s, or record the whole session with voice run --record DIR)")
    return [f"saved {r.get('seconds')} s of sound and the log to {r.get('directory')} (turns: {turns}); "
            f"replay it with: voice replay {r.get('directory')}/scenario.toml --out OUT"]


def _history(r: dict[str, Any]) -> list[str]:
    from voice.log.projections import message_line

    if "conversations" in r:
        return conversation_lines(r["conversations"], r.get("conversation"))
    return [message_line(m) for m in r.get("messages", [])]


def conversation_lines(conversations: list[dict[str, Any]], current: str | None = None) -> list[str]:
    """One line per conversation: id, turns, last activity, how it ended, its first words."""
    import time

    lines = []
    for c in conversations:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c["last_wall"]))
        state = "current" if c["conversation"] == current else (f"ended: {c['ended']}" if c["ended"] else "open")
        words = c["first_words"] if len(c["first_words"]) <= 60 else c["first_words"][:57] + "..."
        lines.append(f"{c['conversation']}  {c['turns']:>4} turns  {when}  {state:<12}  {words}")
    return lines or ["(no conversations yet)"]


def _new(r: dict[str, Any]) -> list[str]:
    if not r.get("ended"):
        return [f"conversation: {r.get('conversation')} (nothing said in it yet: it stays)"]
    return [f"started a new conversation: {r.get('conversation')} ({r['ended']} ended)"]


def _event(r: dict[str, Any]) -> list[str]:
    if "streaming" in r:  # the stream's header: said once, on stderr (stdout is the events alone)
        if r.get("follow"):
            print(f"following the log after #{r.get('after')}: each event as it is written (Ctrl-C stops)",
                  file=sys.stderr, flush=True)
        return []
    turn = f" turn {r['turn']}" if r.get("turn") is not None else ""
    return [f"#{r.get('seq')}{turn} {r.get('type')} {json.dumps(r.get('payload'), ensure_ascii=False)}"]


def _answered(r: dict[str, Any]) -> list[str]:
    always = " (and from now on: voice grants revoke to undo)" if r.get("always") else ""
    return [f"{r.get('decision')}: {r.get('question')}{always}"]


_FORMATS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "status": _status, "say": _say, "cancel": _cancel, "mute": _mute, "unmute": _mute, "history": _history,
    "new": _new, "save": _save, "events": _event, "approve": _answered, "deny": _answered,
}
