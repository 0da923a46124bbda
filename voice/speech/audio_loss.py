"""What the session does when its sound card goes and comes back
(voice.audio.stream_life finds it; the device tells `AudioChanges`).

Lost: `audio/lost` in the log; a reply being spoken ends there, as heard:
its messages deliver what had come out of the speaker at the loss (not what
was handed to it), what was queued is dropped, and the turn ends
`interrupted` with reason `audio_lost`. It is not the person's stop: no
`user/stop`, no new turn. A `notice:` line in the transcript says so (the
speaker cannot). With no sound device at start (`at_start`) it is the same
wait, with nothing to cut.

Back: `audio/back` with the devices and how long it took; the echo
canceller starts afresh (a new device is a new echo path); a notice.
"""

from __future__ import annotations

from collections.abc import Callable

from voice.agent.loop import AgentLoop
from voice.audio.device import AudioBack, AudioLost
from voice.log import events as ev
from voice.speech.speech_log import SpeechLog
from voice.speech.voice_surface import VoiceSurface


class AudioChanges:
    def __init__(self, *, log: SpeechLog, surface: VoiceSurface, agent: AgentLoop,
                 transcript: Callable[[str], None], restart_echo: Callable[[], None]):
        self._log = log
        self._surface = surface
        self._agent = agent
        self._transcript = transcript
        self._restart_echo = restart_echo

    def __call__(self, change: AudioLost | AudioBack) -> None:
        if isinstance(change, AudioLost):
            self.lost(change)
        else:
            self.back(change)

    def lost(self, change: AudioLost) -> None:
        self._log.audio_lost(change, self._agent.current_turn)
        if change.at_start:  # nothing was playing: only say that it waits
            self._transcript(f"notice: waiting for a sound device ({change.reason}); listening as soon as one "
                             "is there")
            return
        self._surface.lose(change.heard_to)  # before the cancel: the turn records what had been heard
        cut = self._agent.cancel(ev.INTERRUPTED, reason=ev.AUDIO_LOST_REASON)
        self._transcript(f"notice: the audio device was lost ({change.reason})"
                         + ("; the reply was cut" if cut else "") + "; reopening it until it is back")

    def back(self, change: AudioBack) -> None:
        self._restart_echo()
        self._log.audio_back(change)
        self._transcript(f"notice: audio is back after {change.after_s:.1f} s ({change.devices})")
