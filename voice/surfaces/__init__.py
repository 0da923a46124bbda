"""Concrete surfaces: text (a terminal) and, from voice.speech, voice."""
