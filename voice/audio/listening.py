"""When a finished utterance is meant for the assistant: the listen gate.

A pure state machine on one clock (seconds of mic stream time; nothing here
reads a clock). Two modes:

- "open": every utterance is for the assistant.
- "wake": an utterance is for the assistant when
  1. a wake word was detected since the last accepted utterance, no more
     than `wake_valid_s` (10 s) before the utterance started (a wake word
     *inside* the utterance, "okay nabu, what time is it", counts), or
  2. the utterance starts inside the conversation window: from the moment
     the assistant finished speaking until `window_s` (8 s) later, so a
     follow-up question needs no wake word. `early_s` (0.5 s) of slack
     before that moment absorbs the VAD back-dating its onset.

A wake word counts once: after an accepted utterance call `consume()`.

Barge-in does not go through this gate. Speech that starts while the
assistant is thinking or speaking stops it at the VAD onset (the session's
`user_started`), before any utterance is complete; that utterance is passed
on without asking the gate (call `consume()` after it all the same, so a
wake word said in it does not carry over). The gate only decides about
utterances that start while the assistant is idle.
"""

from __future__ import annotations

import math

MODES = ("wake", "open")


class ListenGate:
    def __init__(self, mode: str = "wake", window_s: float = 8.0, *, wake_valid_s: float = 10.0,
                 early_s: float = 0.5):
        if mode not in MODES:
            raise ValueError(f"listen mode {mode!r}: allowed {', '.join(MODES)}")
        if window_s < 0 or wake_valid_s < 0 or early_s < 0:
            raise ValueError("window_s, wake_valid_s and early_s must not be negative")
        self.mode = mode
        self.window_s = float(window_s)
        self.wake_valid_s = float(wake_valid_s)
        self.early_s = float(early_s)
        self._wake_t: float | None = None  # the latest unconsumed wake word
        self._stopped_t: float | None = None  # when the assistant last finished speaking

    # -- events -------------------------------------------------------------

    def on_wake(self, t: float) -> None:
        """A wake word was detected at time t."""
        self._wake_t = t

    def on_assistant_stopped(self, t: float) -> None:
        """The assistant finished speaking (or was stopped) at t: the
        conversation window runs until t + window_s."""
        self._stopped_t = t

    def consume(self) -> None:
        """An utterance was accepted (or passed on as a barge-in): the wake
        word that opened it is used up."""
        self._wake_t = None

    # -- decisions ----------------------------------------------------------

    def reason(self, start_t: float) -> str | None:
        """Why an utterance that started at start_t is for the assistant
        ("open", "wake word", "conversation window"), or None when it is not."""
        if self.mode == "open":
            return "open"
        if self._wake_t is not None and self._wake_t >= start_t - self.wake_valid_s:
            return "wake word"
        if self._in_window(start_t):
            return "conversation window"
        return None

    def expects_speech(self, t: float) -> bool:
        """Speech starting at t could be for the assistant: the listener needs
        its VAD now (in wake mode, outside the window and without a recent wake
        word, only the wake-word detector has to listen)."""
        return self.mode == "open" or self.state(t) != "waiting for wake word"

    def accepts_utterance(self, start_t: float) -> bool:
        return self.reason(start_t) is not None

    def window_left(self, t: float) -> float:
        """Seconds of conversation window left at t (0 when none is open)."""
        if not self._in_window(t):
            return 0.0
        return self._stopped_t + self.window_s - t

    def state(self, t: float) -> str:
        """For status lines: "open", "conversation window (N s left)",
        "wake word heard" or "waiting for wake word"."""
        if self.mode == "open":
            return "open"
        if self._in_window(t):
            return f"conversation window ({math.ceil(self.window_left(t))} s left)"
        if self._wake_t is not None and self._wake_t <= t <= self._wake_t + self.wake_valid_s:
            return "wake word heard"
        return "waiting for wake word"

    def _in_window(self, t: float) -> bool:
        s = self._stopped_t
        return s is not None and s - self.early_s <= t <= s + self.window_s
