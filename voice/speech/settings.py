"""The voice session's settings: how the VAD listens, how a barge-in is
judged, how utterances are addressed to the assistant, and how long a
shutdown may take. Built once, from the typed `Settings` (voice.settings),
whose sections these are."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from voice.settings import BargeInSettings, ConversationSettings, ListenSettings, Settings, TurnEndSettings, VadSettings
from voice.speech.judge import STOP_PHRASES


@dataclass(frozen=True)
class VoiceSettings:
    vad: VadSettings = field(default_factory=VadSettings)
    barge_in: BargeInSettings = field(default_factory=lambda: BargeInSettings(stop_phrases=STOP_PHRASES))
    listen: ListenSettings | None = None  # None: open, with no gate at all
    turn_end: TurnEndSettings = field(default_factory=TurnEndSettings)
    shutdown_s: float = 5.0
    conversation: ConversationSettings = field(default_factory=ConversationSettings)

    @classmethod
    def from_settings(cls, settings: Settings, *, listen_mode: str | None = None,
                      window_s: float | None = None) -> VoiceSettings:
        """`listen_mode`/`window_s` override the config's (a replayed
        scenario says how it listens)."""
        listen = replace(settings.listen, mode=listen_mode or settings.listen.mode,
                         window_s=window_s or settings.listen.window_s)
        return cls(vad=settings.vad, barge_in=settings.barge_in, listen=listen, shutdown_s=settings.service.shutdown_s,
                   conversation=settings.conversation, turn_end=settings.turn_end)
