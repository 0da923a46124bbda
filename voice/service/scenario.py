"""Replay scenarios: which user audio starts when, and the scripted LLM.

    llm = "scripted:replies.toml"     # or an inline [[reply]] list
    [[user]]
    audio = "ask.wav"                 # relative to the scenario file
    at = 0.5                          # seconds on the scenario clock
    [[user]]
    audio = "stop_and_ask.wav"
    barge_in_after = 2.4              # seconds after the previous reply's first played sample
                                      # (no reply at all, 2 s of quiet: said then, as a request)
    [[user]]
    audio = "thanks.wav"
    after_reply = 0.8                 # seconds after the previous reply finished playing
    [[user]]
    audio = "more.wav"
    after_idle = 0.5                  # seconds after the previous clip ended and the assistant fell
                                      # quiet, whether or not anything answered it (a long soak)

A `[[tool]]` (name, wait_s, result, effect = "read") adds a tool that
waits `wait_s` seconds and returns `result`: a stand-in for a slow external
tool, so a scenario can talk over the assistant while it waits. It replaces
a real tool of that name, so a replay never acts on the world. A write
stand-in with `receipt` (confirmed, failed or unknown) returns that receipt
and may carry the tool's own `phrase`; without one it returns only its
result, so what it did is unknown. Several [[tool]] tables
with one name answer its calls in order (the last one repeats): a recorded
session's calls. `ask_first = true` makes the assistant ask the person
before each call, as an MCP server's destructive write does.

A recorded session (voice.service.recording) is one [[user]] track at 0:
the microphone as captured, from the device's start; each `[[play]]`
(message = "TURN.STEP.ATTEMPT" as the replay numbers them, one of the
replies' `message`, or its held part "TURN.STEP.ATTEMPT.1"; sentence = its
index, at_s) holds that sentence of a reply until the second where it
began playing in the recording, so that speech synthesis running faster or
slower on another machine does not move the words a barge-in cuts. Its
`timing = "recorded"` makes inference take no time on the replay's clock
(voice.audio.clock, `free_compute`): the recording's times stand for it.
`mic_blocks = "mic_blocks.txt"` (one size a line) cuts the mic into the
blocks the recording's device delivered, since the VAD decides per block.

An `[echo]` table (delay_ms, gain_db, reverb_s = RT60 in seconds (0: none),
noise_db) mixes what the speaker plays back into the mic, as laptop
speakers do. Without it nothing leaks. `[listen] echo_cancellation = false`
turns the canceller off for a scenario (to show what it prevents).

A `[[say]]` (text, at = seconds on the scenario clock) is a typed turn,
as `voice ctl say TEXT` gives one: `voice replay` types it then (within
the scenario's sound; a recorded session's track covers its own). A
`[[control]]` (command = "mute", "unmute", "cancel" or "new", at) is that
`voice ctl` command, given when the listener has heard the mic up to `at`:
a muted stretch is not heard, as in the session that recorded it.

In wake mode, `[listen] wake_word_at` and `assistant_stopped_at` (seconds
on the scenario clock, negative: before it began) are the listen gate's
state at the start, as a saved session that began mid-session had it: a
wake word heard and not yet used, and where the assistant last stopped
speaking (its conversation window, in which a follow-up needs no wake word).

An `[[audio_lost]]` (at = seconds on the scenario clock, or into_reply =
seconds after the first sample of the next reply to begin playing, which
holds however long the reply took to come; back_after = seconds) is the
sound card going away and coming back, told to the session
as the live device tells it (`audio/lost`, `audio/back`): nothing is heard
or played meanwhile, and the scenario's clock stands still (it counts the
mic's samples) while the session's goes on.

Optional top-level keys: `tail = 1.5` (seconds of silence to keep after
the last reply), `max_duration = 180` (a hard stop, seconds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voice.agent.providers.scripted import (DAY_S, ScriptedProvider, ScriptedReply, checked_number,
                                            load_script, parse_replies)
from voice.audio.device import MAX_MIC_BLOCK, MIC_RATE
from voice.audio.replay_device import AudioLoss, EchoPath, UserClip
from voice.audio.wav import read_mono16k
from voice.speech.stt import STT_MODELS
from voice.toml_file import read_toml

_LISTEN = ("echo_cancellation", "mode", "window_s", "wake_word_at", "assistant_stopped_at")
_TOP = {"llm", "reply", "user", "tool", "tail", "max_duration", "stt_model", "echo", "listen", "play", "timing",
        "mic_blocks", "say", "control", "audio_lost"}
_ECHO = {"delay_ms", "gain_db", "reverb_s", "noise_db"}
_TOOL = {"name", "wait_s", "result", "effect", "receipt", "phrase", "ask_first"}
_USER = {"audio", "at", "barge_in_after", "after_reply", "after_idle"}
_WHEN = ("at", "barge_in_after", "after_reply", "after_idle")
CONTROLS = ("mute", "unmute", "cancel", "new")  # the `voice ctl` commands that change what is heard or done


@dataclass(frozen=True)
class ScenarioTool:
    name: str
    wait_s: float
    result: str
    effect: str = "read"
    receipt: str | None = None  # what a write stand-in's receipt says (None: it gives none: unknown)
    phrase: str | None = None
    ask_first: bool = False  # the person is asked before each call (voice.agent.approvals)


@dataclass(frozen=True)
class TypedTurn:
    """A `[[say]]`: text typed (`voice ctl say`) at a second of the scenario's clock."""
    text: str
    at_s: float


@dataclass(frozen=True)
class Control:
    """A `[[control]]`: `voice ctl COMMAND` given at a second of the scenario's clock."""
    command: str
    at_s: float


@dataclass(frozen=True)
class Scenario:
    path: Path
    users: tuple[UserClip, ...]
    replies: tuple[ScriptedReply, ...] | None
    llm: str | None
    tail: float = 1.5
    max_duration: float = 180.0
    stt_model: str | None = None
    tools: tuple[ScenarioTool, ...] = ()
    echo: EchoPath | None = None
    echo_cancellation: bool | None = None  # None: the config decides
    listen_mode: str = "open"  # scenarios listen to everything unless they ask for the wake word
    window_s: float | None = None
    plays: tuple[tuple[str, int, float], ...] = ()  # (message id, sentence, seconds): it starts no sooner
    timing: str = "measured"  # "recorded": inference takes no time on the clock (a recorded session)
    blocks: tuple[int, ...] = ()  # mic block sizes (samples), in order; past them, 20 ms blocks
    says: tuple[TypedTurn, ...] = ()  # typed turns, by time
    controls: tuple[Control, ...] = ()  # mute, unmute, cancel, new, by time
    # the listen gate at the start (wake mode; seconds, <= 0): a wake word not yet used, the window's start
    wake_word_at: float | None = None
    assistant_stopped_at: float | None = None
    losses: tuple[AudioLoss, ...] = ()  # [[audio_lost]]: the sound card going and coming back, by time

    def play_at(self, rate: int) -> dict[tuple[str, int], int]:
        """(message id, sentence) -> the speaker position (at `rate`) it starts no sooner than."""
        return {(message, sentence): round(at_s * rate) for message, sentence, at_s in self.plays}

    def scripted_provider(self, clock=None) -> ScriptedProvider | None:
        """The scenario's own model (its [[reply]] list or scripted file), if it
        has one; `clock` gives the seconds its replies' `at_s` count on."""
        if self.replies is None and self.timing != "recorded":
            return None
        # A recording's model is the replies it recorded, none if it has none:
        # never the machine's own model (a request it did not record is an error, not a wait).
        return ScriptedProvider(list(self.replies or ()), name=self.path.name, clock=clock)


# [echo] value ranges: what a room and a laptop's speaker and mic can do
_ECHO_RANGES = {"delay_ms": (0.0, 1000.0), "gain_db": (-120.0, 20.0), "reverb_s": (0.0, 10.0),
                "noise_db": (-150.0, 0.0)}


def _number(path: Path, where: str, value, low: float, high: float) -> float:
    return checked_number(f"scenario {path}: {where}", value, low, high)


def _text(path: Path, where: str, value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"scenario {path}: {where} = {value!r}: a quoted string")
    return value


def _onset(samples: np.ndarray, threshold: int = 500) -> int:
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > threshold)
    return int(loud[0]) if len(loud) else 0


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    data = read_toml(path, "scenario")
    unknown = set(data) - _TOP
    if unknown:
        raise ValueError(f"scenario {path}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_TOP)}")
    for table in ("user", "tool", "reply", "play", "say", "control", "audio_lost"):
        if table in data and not (isinstance(data[table], list) and all(isinstance(x, dict) for x in data[table])):
            raise ValueError(f"scenario {path}: {table} must be an array of tables, written [[{table}]]")
    users = []
    for n, u in enumerate(data.get("user", []), 1):
        if not isinstance(u, dict) or "audio" not in u:
            raise ValueError(f"scenario {path}: [[user]] {n} needs audio = \"FILE.wav\"")
        bad = set(u) - _USER
        if bad:
            raise ValueError(f"scenario {path}: [[user]] {n} has unknown key(s) {sorted(bad)}; allowed: {sorted(_USER)}")
        given = [k for k in _WHEN if k in u]
        if len(given) != 1:
            raise ValueError(f"scenario {path}: [[user]] {n} needs exactly one of {', '.join(_WHEN)}")
        if n == 1 and given[0] != "at":
            raise ValueError(f"scenario {path}: the first [[user]] must start at a time (at = SECONDS)")
        name = _text(path, f"[[user]] {n} audio", u["audio"])
        when = _number(path, f"[[user]] {n} {given[0]}", u[given[0]], 0.0, DAY_S)
        audio = read_mono16k(path.parent / name)
        if not len(audio):
            raise ValueError(f"scenario {path}: [[user]] {n} audio {name} holds no samples: record the speech again")
        users.append(UserClip(audio, name, given[0], when, _onset(audio)))
    if not users:
        raise ValueError(f"scenario {path} has no [[user]] audio")
    replies = llm = None
    if "reply" in data:
        replies = tuple(parse_replies(data["reply"], str(path)))
    elif "llm" in data:
        llm = str(data["llm"])
        if llm.startswith("scripted:"):
            replies = tuple(load_script(path.parent / llm.removeprefix("scripted:")))
            llm = None
    tools = []
    for n, t in enumerate(data.get("tool", []), 1):
        bad = set(t) - _TOOL
        if bad or "name" not in t:
            raise ValueError(f"scenario {path}: [[tool]] {n} needs a name and allows only {sorted(_TOOL)}")
        if t.get("effect", "read") not in ("read", "write") or t.get("receipt", "unknown") not in (
                "confirmed", "failed", "unknown"):
            raise ValueError(f"scenario {path}: [[tool]] {n}: effect is read or write; receipt confirmed, failed "
                             "or unknown")
        if not isinstance(t.get("ask_first", False), bool):
            raise ValueError(f"scenario {path}: [[tool]] {n}: ask_first is true or false")
        tools.append(ScenarioTool(str(t["name"]), _number(path, f"[[tool]] {n} wait_s", t.get("wait_s", 0), 0.0, DAY_S),
                                  str(t.get("result", "")),
                                  str(t.get("effect", "read")), t.get("receipt"),
                                  str(t["phrase"]) if "phrase" in t else None, t.get("ask_first", False)))
    echo = None
    if "echo" in data:
        if not isinstance(data["echo"], dict) or set(data["echo"]) - _ECHO:
            raise ValueError(f"scenario {path}: [echo] allows only {sorted(_ECHO)}")
        echo = EchoPath(**{k: _number(path, f"[echo] {k}", v, *_ECHO_RANGES[k]) for k, v in data["echo"].items()})
    listen = data.get("listen", {})
    if not isinstance(listen, dict) or set(listen) - set(_LISTEN):
        raise ValueError(f"scenario {path}: [listen] allows only {', '.join(_LISTEN)}")
    if not isinstance(listen.get("echo_cancellation", False), bool):
        raise ValueError(f"scenario {path}: [listen] echo_cancellation = {listen['echo_cancellation']!r}: "
                         "true or false, unquoted")
    if listen.get("mode", "open") not in ("open", "wake"):
        raise ValueError(f"scenario {path}: [listen] mode = {listen['mode']!r}: \"open\" or \"wake\"")
    window_s = _number(path, "[listen] window_s", listen["window_s"], 0.5, DAY_S) if "window_s" in listen else None
    gate_at = {key: _number(path, f"[listen] {key}", listen[key], -DAY_S, 0.0) if key in listen else None
               for key in ("wake_word_at", "assistant_stopped_at")}
    timing = data.get("timing", "measured")
    if timing not in ("measured", "recorded"):
        raise ValueError(f"scenario {path}: timing is \"measured\" (inference takes its time) or \"recorded\"")
    plays = _plays(path, data.get("play", []), replies or ())
    stt_model = _text(path, "stt_model", data["stt_model"]) if "stt_model" in data else None
    if stt_model is not None and stt_model not in STT_MODELS:
        raise ValueError(f"scenario {path}: stt_model = {stt_model!r}: allowed {', '.join(STT_MODELS)}")
    mic_blocks = _text(path, "mic_blocks", data["mic_blocks"]) if "mic_blocks" in data else None
    return Scenario(path, tuple(users), replies, llm, _number(path, "tail", data.get("tail", 1.5), 0.0, DAY_S),
                    _number(path, "max_duration", data.get("max_duration", 180.0), 1.0, DAY_S), stt_model,
                    tuple(tools), echo, listen.get("echo_cancellation"), listen.get("mode", "open"), window_s,
                    tuple(plays), timing, _blocks(path, mic_blocks), _says(path, data.get("say", [])),
                    _controls(path, data.get("control", [])), **gate_at,
                    losses=_losses(path, data.get("audio_lost", [])))


def _losses(path: Path, raw: list[dict]) -> tuple[AudioLoss, ...]:
    """Losses in the order they come: by `at` when every one has it, else as written."""
    losses = []
    for n, loss in enumerate(raw, 1):
        if unknown := set(loss) - {"at", "into_reply", "back_after"}:
            raise ValueError(f"scenario {path}: [[audio_lost]] {n} has unknown key(s) {sorted(unknown)}; "
                             "allowed: at or into_reply, and back_after")
        if set(loss) not in ({"at", "back_after"}, {"into_reply", "back_after"}):
            raise ValueError(f"scenario {path}: [[audio_lost]] {n} needs exactly at = SECONDS (the scenario's clock) "
                             "or into_reply = SECONDS (after the next reply's first sample), and back_after = "
                             "SECONDS (how long the sound card stays away)")
        when = "at" if "at" in loss else "into_reply"
        seconds = _number(path, f"[[audio_lost]] {n} {when}", loss[when], 0.0, DAY_S)
        losses.append(AudioLoss(seconds if when == "at" else None,
                                _number(path, f"[[audio_lost]] {n} back_after", loss["back_after"], 0.02, DAY_S),
                                seconds if when == "into_reply" else None))
    if all(loss.at_s is not None for loss in losses):
        losses.sort(key=lambda loss: loss.at_s)
    return tuple(losses)


def _says(path: Path, raw: list[dict]) -> tuple[TypedTurn, ...]:
    says = []
    for n, t in enumerate(raw, 1):
        if set(t) != {"text", "at"}:
            raise ValueError(f"scenario {path}: [[say]] {n} needs exactly text = \"WORDS\" and at = SECONDS")
        text = _text(path, f"[[say]] {n} text", t["text"])
        if not text.strip():
            raise ValueError(f"scenario {path}: [[say]] {n} text is empty: type the words the person typed")
        says.append(TypedTurn(text, _number(path, f"[[say]] {n} at", t["at"], 0.0, DAY_S)))
    return tuple(sorted(says, key=lambda t: t.at_s))


def _controls(path: Path, raw: list[dict]) -> tuple[Control, ...]:
    controls = []
    for n, c in enumerate(raw, 1):
        if set(c) != {"command", "at"} or c["command"] not in CONTROLS:
            raise ValueError(f"scenario {path}: [[control]] {n} needs exactly command = one of "
                             f"{', '.join(json.dumps(k) for k in CONTROLS)} and at = SECONDS")
        controls.append(Control(c["command"], _number(path, f"[[control]] {n} at", c["at"], 0.0, DAY_S)))
    return tuple(sorted(controls, key=lambda c: c.at_s))  # (a stable sort: those at one second keep their order)


def _plays(path: Path, raw: list[dict], replies: tuple[ScriptedReply, ...]) -> list[tuple[str, int, float]]:
    """Each [[play]], whose message must be one of the replies' (or its
    held part, ".1"): a play that names no reply would hold nothing, and
    the replay would go its own way without a word."""
    ids = [r.message for r in replies if r.message is not None]
    plays = []
    for n, p in enumerate(raw, 1):
        if set(p) != {"message", "sentence", "at_s"} or not isinstance(p["sentence"], int) \
                or isinstance(p["sentence"], bool) or p["sentence"] < 0:
            raise ValueError(f"scenario {path}: [[play]] {n} needs exactly message = \"TURN.STEP.ATTEMPT\", "
                             "sentence = INDEX and at_s = SECONDS")
        message = _text(path, f"[[play]] {n} message", p["message"])
        if message.removesuffix(".1") not in ids:
            there = f"the replies are {', '.join(ids)}" if ids else "no reply has one"
            raise ValueError(f"scenario {path}: [[play]] {n} message = {json.dumps(message)} names no [[reply]]: "
                             f"{there} (each one's message = \"TURN.STEP.ATTEMPT\")")
        plays.append((message, p["sentence"], _number(path, f"[[play]] {n} at_s", p["at_s"], 0.0, DAY_S)))
    return plays


def _blocks(path: Path, name: str | None) -> tuple[int, ...]:
    if name is None:
        return ()
    try:
        sizes = tuple(int(line) for line in (path.parent / name).read_text().split())
    except OSError as exc:
        raise ValueError(f"scenario {path}: mic_blocks {name}: {exc.strerror or exc}") from None
    except ValueError:
        raise ValueError(f"scenario {path}: mic_blocks {name} must hold one block size (samples) a line") from None
    if any(not 0 < n <= MAX_MIC_BLOCK for n in sizes):  # what a device hands on (voice.audio.device)
        raise ValueError(f"scenario {path}: mic_blocks {name}: block sizes must be from 1 to {MAX_MIC_BLOCK} samples "
                         f"({MAX_MIC_BLOCK / MIC_RATE:g} s at {MIC_RATE} Hz)")
    return sizes
