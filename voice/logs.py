"""Logging: pipecat logs through loguru at DEBUG by default; keep our
terminal for the transcript and real problems."""

from __future__ import annotations

import sys


def quiet_pipecat(level: str = "WARNING") -> None:
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level=level)
