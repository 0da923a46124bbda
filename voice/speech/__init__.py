"""Speech: recognition (faster-whisper), synthesis with word timings (piper),
and the voice surface that knows which words the person heard."""
