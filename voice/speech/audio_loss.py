"""What the session does when its sound card goes and comes back
(voice.audio.stream_life finds it; the device tells `AudioChanges`).

Lost: `audio/lost` in the log; a reply being spoken ends there, as heard:
its messages deliver what had come out of the speaker at the loss (not what
was handed to it), what was queued is dropped, and the turn ends
`interrupted` with reason `audio_lost`. It is not the person's stop: no
`user/stop`, no new turn, and a tool call already dispatched runs to its
receipt (its effect recorded with its real outcome) before the turn ends;
the calls after it are not dispatched. Words the person was saying are cut
off at the loss (`ListenProcessor.broke_off`): not a request, and not joined
to what they say once the mic is back. A `notice:` line in the transcript
says so (the speaker cannot). With no sound device at start (`at_start`) it
is the same wait, with nothing to cut: a request typed meanwhile (`voice ctl
say`) is answered in writing, as after a loss.

What the assistant would have said meanwhile of its own (the phrase that
announces the tool's outcome, a timer) the voice surface keeps
(`VoiceSurface.unsaid`); so is a phrase announcing an outcome that the
loss cut before it had fully played, and one the turn kept though the
speaker is back by the time it ends (`VoiceSurface.owe`). `run()` says it
once audio is back, or, once the conversation's idle gap
(`conversation.idle_gap_s`, counted from when it could not be said) has
passed, writes it down as a `notice:` line instead: news that old is not
spoken into a room. Each is `speech/owed` in the log, once.

Back: `audio/back` with the devices and how long it took; the echo
canceller starts afresh (a new device is a new echo path); a notice.

A device pinned in the config that goes away: the device falls back to the
system's defaults, and returns to the pinned one once it is there again;
each is `audio/pinned`, a notice and a fresh echo canceller.

Muted (the microphone delivers exact zeros: voice.audio.mic_mute):
`audio/muted` and a notice, once; nothing else changes (a reply plays on,
the stream is not lost). Sound again: `audio/unmuted` and a notice.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from voice.agent.loop import AgentLoop
from voice.audio.device import AudioBack, AudioChange, AudioLost, MicMuted, MicUnmuted, PinnedChange
from voice.log import events as ev
from voice.speech.speech_log import SpeechLog
from voice.speech.voice_surface import VoiceSurface


class AudioChanges:
    def __init__(self, *, log: SpeechLog, surface: VoiceSurface, agent: AgentLoop,
                 transcript: Callable[[str], None], restart_echo: Callable[[], None],
                 mic_broke_off: Callable[[], None] = lambda: None, idle_gap_s: float | None = None):
        self._log = log
        self._surface = surface
        self._agent = agent
        self._transcript = transcript
        self._restart_echo = restart_echo
        self._mic_broke_off = mic_broke_off  # words being said when the mic went are cut off, not joined to the next
        self._idle_gap_s = idle_gap_s  # None: what was kept waits for the speaker however long

    def __call__(self, change: AudioChange) -> None:
        if isinstance(change, AudioLost):
            self.lost(change)
        elif isinstance(change, AudioBack):
            self.back(change)
        elif isinstance(change, PinnedChange):
            self.pinned(change)
        elif isinstance(change, MicMuted):
            self.muted(change)
        else:
            self.unmuted(change)

    def lost(self, change: AudioLost) -> None:
        self._log.audio_lost(change, self._agent.current_turn)
        if change.at_start:  # nothing was playing: say that it waits; what is asked meanwhile is answered in writing
            self._surface.lose(change.heard_to)
            self._transcript(f"notice: waiting for a sound device ({change.reason}); listening as soon as one "
                             "is there")
            return
        self._mic_broke_off()
        self._surface.lose(change.heard_to)  # before the cancel: the turn records what had been heard
        cut = self._agent.cancel(ev.INTERRUPTED, reason=ev.AUDIO_LOST_REASON, finish_dispatched=True)
        self._transcript(f"notice: the audio device was lost ({change.reason})"
                         + ("; the reply was cut" if cut else "") + "; reopening it until it is back")

    def back(self, change: AudioBack) -> None:
        self._restart_echo()
        self._log.audio_back(change)
        self._transcript(f"notice: audio is back after {change.after_s:.1f} s ({change.devices})")
        self._surface.found()  # what was kept meanwhile is said now (run)

    async def run(self) -> None:
        """Deliver what the surface kept while the speaker was lost: said
        once it is back, written down once the idle gap has passed. Wakes
        when something is kept, when the speaker is back, and at the gap's
        deadline; never returns."""
        while True:
            changed = self._surface.unsaid_changed()  # armed before looking
            wait_s = float("inf")
            if self._surface.unsaid and not self._surface.speaker_lost:
                for unsaid in self._surface.take_unsaid():
                    self._log.owed(unsaid.text, ev.OWED_ALOUD, time.time() - unsaid.at_wall)
                    await self._surface.notice(unsaid.text)
                continue
            if self._surface.unsaid and self._idle_gap_s is not None:
                now = time.time()
                for unsaid in self._surface.take_unsaid(older_than=now - self._idle_gap_s):
                    # too old to be said: written down, once
                    self._log.owed(unsaid.text, ev.OWED_NOTICE, now - unsaid.at_wall)
                    self._transcript(f"notice: {unsaid.text} (not said: the audio device was lost)")
                if self._surface.unsaid:
                    wait_s = self._surface.unsaid[0].at_wall + self._idle_gap_s - now
            with anyio.move_on_after(wait_s):
                await changed.wait()

    def pinned(self, change: PinnedChange) -> None:
        """A pinned device gone (the defaults in use meanwhile) or back: a new echo path either way, and a
        new microphone (what was being said is cut off there, as at a loss)."""
        self._mic_broke_off()
        self._restart_echo()
        self._log.audio_pinned(change)
        if change.present:
            self._transcript(f"notice: the pinned audio device is back ({change.pinned}); in use ({change.devices})")
        else:
            self._transcript(f"notice: the pinned audio device is gone ({change.pinned}); using the system's default "
                             f"until it is back ({change.devices})")

    def muted(self, change: MicMuted) -> None:
        self._log.audio_muted(change)
        self._transcript(f"notice: the microphone is muted: it has given exact digital silence for "
                         f"{change.silent_s:.0f} s (a mute key or switch?); nothing is heard until it is unmuted")

    def unmuted(self, change: MicUnmuted) -> None:
        self._log.audio_unmuted(change)
        self._transcript(f"notice: the microphone is unmuted (it was muted for {change.muted_s:.0f} s)")
