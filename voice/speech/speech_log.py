"""The voice session's log writers: every row the speech side records goes
through these two observers, so the session and its processors write none.

`UnitRows`, for the voice surface and synthesis, files rows under the
conversation of the unit (message) they belong to, so it needs nothing but
the log and is made before the agent:

- `sentences(ref, bodies)`: `speech/sentence` of a settled or stopped
  message (from the voice surface);
- `late(kind, ref, info)`: `late/output`, speech that came too late to be
  used (from synthesis and the surface); the speech side's one `LateOutput`
  writer.

`SpeechLog` files the rest under the agent's current conversation (it
changes when a conversation ends), at the listener's mic position, read at
each write; it is made after the agent and the listener:

- `speech(body, turn)`: the barge-in controller's `speech/paused|resumed|
  confirmed|cleared` and the listener's `listen/speech|wake|window`;
- `clock()`: `audio/clock`, the device's sample positions, so that log
  times and recordings share one clock (at the start and before each turn);
- `control(command)`: `listen/control`, a `voice ctl mute|unmute|cancel|new`
  at the mic position it came (a saved session replays it there);
- `user_stop(...)`: `user/stop`, the person's stop, in its place in the
  turn order (from the turn runner);
- `audio_lost(change, turn)`, `audio_back(change)`: `audio/lost` and
  `audio/back`, the sound card going and coming, and `owed(...)`:
  `speech/owed`, what it kept from being said, delivered
  (voice.speech.audio_loss);
- `audio_muted(change)`, `audio_unmuted(change)`: `audio/muted` and
  `audio/unmuted`, the microphone's exact zeros (voice.speech.audio_loss);
- `resumed(asleep_s)`: `system/resumed`, the computer woke from sleep
  (voice.speech.after_sleep).

"""

from __future__ import annotations

from typing import Any, Protocol

from voice.agent.surface import UnitRef
from voice.audio.device import AudioBack, AudioLost, MicMuted, MicUnmuted, PinnedChange
from voice.log.events import (AudioClock, AudioMuted, AudioUnmuted, Body, DeviceBack, DeviceLost, DevicePinned,
                              ListenControl, SpeechOwed, SpeechSentence, SystemResumed, UserStop)
from voice.log.late import record_late
from voice.log.store import EventStore

NOTICE = "notice"  # the conversation of the assistant's own notices: part of no turn, never logged here


class Answering(Protocol):
    """Who answers, in which conversation now (voice.agent.loop.AgentLoop)."""

    @property
    def conversation(self) -> str: ...


class MicClock(Protocol):
    """How far the mic has got, in samples (voice.speech.listener.Listener)."""

    @property
    def position(self) -> int: ...


class UnitRows:
    """The rows of a message's speech, under the message's own conversation."""

    def __init__(self, store: EventStore):
        self.store = store

    def sentences(self, ref: UnitRef, bodies: list[SpeechSentence]) -> None:
        """speech/sentence of a settled or stopped message, for the surface."""
        if ref.conversation == NOTICE:
            return  # the assistant's own notices are not part of any turn
        for body in bodies:
            self.store.record(ref.conversation, body, turn=ref.turn, step=ref.step, attempt=ref.attempt)

    def late(self, kind: str, ref: UnitRef, info: dict[str, Any]) -> None:
        if ref.conversation == NOTICE:
            return  # the assistant's own notices are not part of any turn
        # (filed under the unit's own conversation: it may have ended since)
        record_late(self.store, ref.conversation, kind, message_id=ref.message_id,
                    turn=ref.turn, step=ref.step, attempt=ref.attempt, **info)


class SpeechLog:
    def __init__(self, store: EventStore, device: Any, *, answering: Answering, mic: MicClock):
        self.store = store
        self.device = device  # an AudioDevice: its buffer and output latency
        self._answering = answering
        self._mic = mic

    def _conversation(self) -> str:
        return self._answering.conversation

    def _mic_position(self) -> int:
        return self._mic.position

    def speech(self, body: Body, turn: int | None) -> None:
        """speech/* for the barge-in controller, listen/* for the listener."""
        self.store.record(self._conversation(), body, turn=turn)

    def clock(self) -> None:
        """audio/clock: the device's sample positions now."""
        buffer = self.device.buffer
        self.store.record(self._conversation(), AudioClock(
            mic=self._mic_position(), speaker=buffer.position, speaker_rate=buffer.rate,
            output_latency=self.device.output_latency()), turn=None)

    def control(self, command: str) -> None:
        """listen/control: a control of the session, where the mic has got to."""
        self.store.record(self._conversation(), ListenControl(command=command, position=self._mic_position()),
                          turn=None)

    def user_stop(self, text: str, source: str, intent: str, stopped_turn: int | None) -> None:
        """The person's stop: a record of what they said, in no turn of its
        own (it is not a request), filed under the turn it stopped."""
        self.store.record(self._conversation(), UserStop(content=text, source=source, intent=intent,
                                                         stopped_turn=stopped_turn), turn=stopped_turn)

    def audio_lost(self, change: AudioLost, turn: int | None) -> None:
        """audio/lost, filed under the turn it cut (if one ran)."""
        self.store.record(self._conversation(), DeviceLost(reason=change.reason, speaker=change.heard_to,
                                                           mic=self._mic_position()), turn=turn)

    def audio_back(self, change: AudioBack) -> None:
        self.store.record(self._conversation(), DeviceBack(devices=change.devices, after_s=round(change.after_s, 3),
                                                           attempts=change.attempts), turn=None)

    def owed(self, text: str, said: str, waited_s: float) -> None:
        """speech/owed: a notice the lost speaker could not say, said aloud now or written down."""
        self.store.record(self._conversation(), SpeechOwed(text=text, said=said, waited_s=round(waited_s, 3)),
                          turn=None)

    def audio_pinned(self, change: PinnedChange) -> None:
        """audio/pinned: a pinned device gone (the defaults in use) or back."""
        self.store.record(self._conversation(), DevicePinned(pinned=change.pinned, devices=change.devices,
                                                             present=change.present), turn=None)

    def resumed(self, asleep_s: float) -> None:
        """system/resumed (no turn)."""
        self.store.record(self._conversation(), SystemResumed(asleep_s=round(asleep_s, 1)), turn=None)

    def audio_muted(self, change: MicMuted) -> None:
        self.store.record(self._conversation(), AudioMuted(silent_s=round(change.silent_s, 3),
                                                           position=self._mic_position()), turn=None)

    def audio_unmuted(self, change: MicUnmuted) -> None:
        self.store.record(self._conversation(), AudioUnmuted(muted_s=round(change.muted_s, 3),
                                                             position=self._mic_position()), turn=None)
