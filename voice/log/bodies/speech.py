"""The bodies of what the voice session hears and plays: playback, the
barge-in's pause and cut, synthesized sentences, the device clock, the
listener's speech and wake word, output that came too late."""

from __future__ import annotations

from dataclasses import dataclass, field

from voice.log.bodies.base import Body, optional


@dataclass(frozen=True, kw_only=True)
class SpeechPlayed(Body):
    """How much of an assistant message the person heard."""

    TYPE = "speech/played"
    message_id: str
    chars: int = 0
    words: int = 0
    samples: int = 0
    complete: bool = False


@dataclass(frozen=True, kw_only=True)
class SpeechPaused(Body):
    """Speech began while the assistant talked: its output paused (not yet a stop)."""

    TYPE = "speech/paused"
    onset: int  # the microphone sample where the speech began
    at: int | None = optional()  # the speaker position where the output paused


@dataclass(frozen=True, kw_only=True)
class SpeechResumed(Body):
    """It was not a barge-in (a backchannel, a cough, its own echo): playback went on."""

    TYPE = "speech/resumed"
    onset: int
    reason: str | None = None
    at: int | None = optional()  # the speaker position where the output went on


@dataclass(frozen=True, kw_only=True)
class SpeechConfirmed(Body):
    """The pause was a barge-in after all: the turn is cut."""

    TYPE = "speech/confirmed"
    onset: int  # mic position where the speech began
    at: int  # mic position where it was decided
    reason: str | None = None  # "voiced speech", or the words that decided


@dataclass(frozen=True, kw_only=True)
class SpeechCleared(Body):
    """What was queued for the speaker was dropped (the cut)."""

    TYPE = "speech/cleared"
    at: int  # speaker position of the clear
    onset: int | None = None  # the barge-in's onset; null for `voice ctl cancel` or a late stop


@dataclass(frozen=True, kw_only=True)
class SpeechSentence(Body):
    """One synthesized sentence of an assistant message and where it played,
    written once the message is settled or stopped: what `voice show`
    places the reply's words by. Positions are speaker samples."""

    TYPE = "speech/sentence"
    message_id: str
    index: int
    char_start: int  # offsets in the message's own text (the model's, before the speakable form)
    char_end: int
    start: int | None  # speaker position of its first sample; null: never handed over
    length: int  # samples
    handed: int  # samples handed to the device
    method: str  # how word times were found (alignments, estimate, failed)
    words: list[list[int]] = field(default_factory=list)  # [char_start, char_end, start, end]: sentence samples
    # When its synthesis was asked for and its audio was ready, on the log's at_mono clock; `early`: made by
    # the early start's speculative synthesis (voice.speech.early_speech), begun before the commit or after it.
    asked: float | None = optional()
    ready: float | None = optional()
    early: bool = optional(False)


@dataclass(frozen=True, kw_only=True)
class AudioClock(Body):
    """The device's sample positions now: pairs the log's `at_mono` with the
    sample clock of the microphone and the speaker (and so a recording)."""

    TYPE = "audio/clock"
    mic: int  # mic samples at 16 kHz since the device started
    speaker: int  # speaker samples since the device started
    speaker_rate: int
    output_latency: int  # speaker samples handed over and not yet heard


@dataclass(frozen=True, kw_only=True)
class DeviceLost(Body):
    """The sound card went away (voice.audio.stream_life): nothing is heard
    or played until `audio/back`; a reply it cut ends `interrupted`."""

    TYPE = "audio/lost"
    reason: str  # the error, or the stall, in words
    speaker: int  # speaker position: what had come out of the speaker when the sound stopped
    mic: int | None = None  # mic position then: where a recording's replay loses its sound card (older logs: none)


@dataclass(frozen=True, kw_only=True)
class DeviceBack(Body):
    """The sound card streams again (mic audio reached the service)."""

    TYPE = "audio/back"
    devices: str  # the devices now in use
    after_s: float  # since `audio/lost`
    attempts: int  # openings tried


@dataclass(frozen=True, kw_only=True)
class SpeechOwed(Body):
    """A notice the lost speaker could not say (the phrase announcing a
    tool's outcome, a timer), delivered: said aloud once audio was back, or
    only written in the transcript once the conversation's idle gap had
    passed (voice.speech.audio_loss)."""

    TYPE = "speech/owed"
    text: str
    said: str  # "aloud" | "notice"
    waited_s: float  # from when it could not be said


@dataclass(frozen=True, kw_only=True)
class DevicePinned(Body):
    """A device pinned in the config went away (the default devices are used
    meanwhile: `present` false) or is in use again (`present` true)."""

    TYPE = "audio/pinned"
    pinned: str  # the pinned devices, as the config names them
    devices: str  # the devices now in use
    present: bool


@dataclass(frozen=True, kw_only=True)
class SystemResumed(Body):
    """The computer woke from sleep (voice.agent.sleep_watch): the boot-time
    clock, which counts sleep, ran ahead of the monotonic one by `asleep_s`."""

    TYPE = "system/resumed"
    asleep_s: float  # seconds asleep


@dataclass(frozen=True, kw_only=True)
class AudioMuted(Body):
    """The microphone delivers exact digital zeros (a mute key): nothing is
    heard until `audio/unmuted`. The stream runs on; it is not lost."""

    TYPE = "audio/muted"
    silent_s: float  # the seconds of exact zeros it took to say so
    position: int  # the mic position when it was said


@dataclass(frozen=True, kw_only=True)
class AudioUnmuted(Body):
    """Sound from the microphone again after `audio/muted`."""

    TYPE = "audio/unmuted"
    muted_s: float  # the seconds of exact zeros, all told
    position: int  # the mic position where the block that brought sound again begins


@dataclass(frozen=True, kw_only=True)
class ListenSpeech(Body):
    """One stretch of speech the VAD heard (mic positions), written when it ended."""

    TYPE = "listen/speech"
    start: int  # the onset
    end: int  # the end of its last voiced block
    decided: int | None  # where the end of the utterance was decided (null: it was cut short)
    for_assistant: bool  # the listen gate passed it on


@dataclass(frozen=True, kw_only=True)
class ListenWake(Body):
    """The wake word was heard."""

    TYPE = "listen/wake"
    position: int  # mic position
    model: str


@dataclass(frozen=True, kw_only=True)
class ListenWindow(Body):
    """The assistant stopped speaking: in wake mode the conversation window,
    in which a follow-up needs no wake word, runs from here (a saved session
    that begins inside it replays with it open: voice.service.recording)."""

    TYPE = "listen/window"
    position: int  # mic position


@dataclass(frozen=True, kw_only=True)
class ListenControl(Body):
    """A control that changes what the assistant hears or does (`voice ctl
    mute|unmute|cancel|new`), at the mic position it came: a saved session
    replays it there (voice.service.recording)."""

    TYPE = "listen/control"
    command: str  # mute | unmute | cancel | new
    position: int  # mic position


@dataclass(frozen=True, kw_only=True)
class LateOutput(Body):
    """Output of a stopped or superseded unit that arrived late and was dropped."""

    TYPE = "late/output"
    kind: str  # tts-text | tts-audio | tts-failed | timer | ...
    message_id: str | None = optional()
    sentence: int | None = optional()
    samples: int | None = optional()
    error: str | None = optional()
    timer_id: str | None = optional()
    tool_call_id: str | None = optional()  # mcp-result: the call whose result came after it was cancelled
    server: str | None = optional()  # mcp-result: the MCP server that sent it
