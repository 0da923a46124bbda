"""What the voice session does when the computer wakes from sleep
(voice.agent.sleep_watch notices it; the session listens while it runs).

- `system/resumed` in the log, with the seconds asleep, and a `notice:`
  line in the transcript;
- the sound card's streams are reopened at once (they are often dead after
  a resume): told as a loss and a return (voice.speech.audio_loss), so a
  reply the sleep cut ends `interrupted` with what had been heard;
- the idle gap is looked at again now: its wait ran on the monotonic clock,
  which stood still asleep, while the log's clock (the wall clock) went on,
  so a conversation idle past the gap ends at resume, not the gap's
  remainder later.

Timers that came due meanwhile ring by themselves (voice.agent.timer_service),
after this: the speaker they ring into is the reopened one.
"""

from __future__ import annotations

from collections.abc import Callable

from voice.agent.sleep_watch import Resumed
from voice.agent.timer_service import spoken_duration
from voice.audio.device import AudioDevice
from voice.speech.conversation_policy import ConversationPolicy
from voice.speech.speech_log import SpeechLog


class AfterSleep:
    def __init__(self, *, log: SpeechLog, device: AudioDevice, conversations: ConversationPolicy,
                 transcript: Callable[[str], None]):
        self._log = log
        self._device = device
        self._conversations = conversations
        self._transcript = transcript

    def __call__(self, resumed: Resumed) -> None:
        asleep = spoken_duration(resumed.asleep_s)
        self._log.resumed(resumed.asleep_s)
        self._transcript(f"notice: the computer was asleep for {asleep}; reopening the audio device")
        self._device.reopen(f"the computer slept for {asleep}")
        self._conversations.changed()
