"""Replay scenarios: which user audio starts when, and the scripted LLM.

    llm = "scripted:replies.toml"     # or an inline [[reply]] list
    [[user]]
    audio = "ask.wav"                 # relative to the scenario file
    at = 0.5                          # seconds on the scenario clock
    [[user]]
    audio = "stop_and_ask.wav"
    barge_in_after = 2.4              # seconds after the previous reply's first played sample
    [[user]]
    audio = "thanks.wav"
    after_reply = 0.8                 # seconds after the previous reply finished playing
    [[user]]
    audio = "more.wav"
    after_idle = 0.5                  # seconds after the previous clip ended and the assistant fell
                                      # quiet, whether or not anything answered it (a long soak)

A `[[tool]]` (name, wait_s, result, effect = "read") adds a tool that
waits `wait_s` seconds and returns `result`: a stand-in for a slow external
tool, so a scenario can talk over the assistant while it waits.

An `[echo]` table (delay_ms, gain_db, reverb_s = RT60 in seconds (0: none),
noise_db) mixes what the speaker plays back into the mic, as laptop
speakers do. Without it nothing leaks. `[listen] echo_cancellation = false`
turns the canceller off for a scenario (to show what it prevents).

Optional top-level keys: `tail = 1.5` (seconds of silence to keep after
the last reply), `max_duration = 180` (a hard stop, seconds).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voice.agent.providers.scripted import ScriptedProvider, ScriptedReply, load_script, parse_replies
from voice.audio.replay_device import EchoPath, UserClip
from voice.audio.wav import read_mono16k

_TOP = {"llm", "reply", "user", "tool", "tail", "max_duration", "stt_model", "echo", "listen"}
_ECHO = {"delay_ms", "gain_db", "reverb_s", "noise_db"}
_TOOL = {"name", "wait_s", "result", "effect"}
_USER = {"audio", "at", "barge_in_after", "after_reply", "after_idle"}
_WHEN = ("at", "barge_in_after", "after_reply", "after_idle")


@dataclass(frozen=True)
class ScenarioTool:
    name: str
    wait_s: float
    result: str
    effect: str = "read"


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

    def scripted_provider(self) -> ScriptedProvider | None:
        """The scenario's own model (its [[reply]] list or scripted file), if it has one."""
        return ScriptedProvider(list(self.replies), name=self.path.name) if self.replies is not None else None


def _onset(samples: np.ndarray, threshold: int = 500) -> int:
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > threshold)
    return int(loud[0]) if len(loud) else 0


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"scenario not found: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"scenario {path} is a directory: give its .toml file") from None
    except OSError as exc:
        raise ValueError(f"cannot read the scenario {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"scenario {path} is not valid TOML: {exc}") from None
    unknown = set(data) - _TOP
    if unknown:
        raise ValueError(f"scenario {path}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_TOP)}")
    for table in ("user", "tool", "reply"):
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
        audio = read_mono16k(path.parent / u["audio"])
        users.append(UserClip(audio, u["audio"], given[0], float(u[given[0]]), _onset(audio)))
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
        tools.append(ScenarioTool(str(t["name"]), float(t.get("wait_s", 0)), str(t.get("result", "")),
                                  str(t.get("effect", "read"))))
    echo = None
    if "echo" in data:
        if not isinstance(data["echo"], dict) or set(data["echo"]) - _ECHO:
            raise ValueError(f"scenario {path}: [echo] allows only {sorted(_ECHO)}")
        echo = EchoPath(**{k: float(v) for k, v in data["echo"].items()})
    listen = data.get("listen", {})
    if not isinstance(listen, dict) or set(listen) - {"echo_cancellation", "mode", "window_s"}:
        raise ValueError(f"scenario {path}: [listen] allows only echo_cancellation, mode, window_s")
    return Scenario(path, tuple(users), replies, llm, float(data.get("tail", 1.5)),
                    float(data.get("max_duration", 180.0)), data.get("stt_model"), tuple(tools), echo,
                    listen.get("echo_cancellation"), str(listen.get("mode", "open")),
                    float(listen["window_s"]) if "window_s" in listen else None)
