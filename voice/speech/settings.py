"""The voice session's settings, read once from the (already checked)
config: how the VAD listens, how a barge-in is judged, how utterances are
addressed to the assistant, and how long a shutdown may take."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from voice.speech.judge import STOP_PHRASES
from voice.speech.turn_end import TurnEndSettings


@dataclass(frozen=True)
class VadSettings:
    confidence: float = 0.7
    start_secs: float = 0.05
    stop_secs: float = 0.6
    min_volume: float = 0.4


@dataclass(frozen=True)
class BargeInSettings:
    confirm_ms: float = 500.0
    resume_ms: float = 2000.0
    stop_phrases: tuple[str, ...] = STOP_PHRASES


@dataclass(frozen=True)
class ListenSettings:
    mode: str = "wake"  # "wake": a wake word (or the conversation window) first; "open": everything
    wake_word: str = "okay_nabu"
    window_s: float = 8.0


@dataclass(frozen=True)
class ConversationRules:
    """When a spoken conversation ends (config [conversation])."""

    idle_gap_s: float | None = None  # None: only when asked
    new_phrases: tuple[str, ...] = ()  # what the person says to start a new one
    new_reply: str = ""  # said back ("" says nothing)


@dataclass(frozen=True)
class VoiceSettings:
    vad: VadSettings = field(default_factory=VadSettings)
    barge_in: BargeInSettings = field(default_factory=BargeInSettings)
    listen: ListenSettings | None = None  # None: open, with no gate at all
    turn_end: TurnEndSettings = field(default_factory=TurnEndSettings)
    shutdown_s: float = 5.0
    conversation: ConversationRules = field(default_factory=ConversationRules)

    @classmethod
    def from_config(cls, config: dict[str, Any], *, listen_mode: str | None = None,
                    window_s: float | None = None) -> VoiceSettings:
        """`listen_mode`/`window_s` override the config's (a replayed
        scenario says how it listens)."""
        listen = config["listen"]
        barge_in = dict(config["barge_in"])
        barge_in["stop_phrases"] = tuple(barge_in["stop_phrases"])
        return cls(
            vad=VadSettings(**config["vad"]),
            barge_in=BargeInSettings(**barge_in),
            listen=ListenSettings(listen_mode or listen["mode"], listen["wake_word"], window_s or listen["window_s"]),
            shutdown_s=config["service"]["shutdown_s"],
            conversation=conversation_rules(config),
            turn_end=TurnEndSettings(**config["turn_end"]),
        )


def conversation_rules(config: dict[str, Any]) -> ConversationRules:
    c = config["conversation"]
    return ConversationRules(c["idle_gap_s"], tuple(c["new_phrases"]), c["new_reply"])
