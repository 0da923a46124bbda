"""Language-model providers behind one streaming interface (see base.py)."""

from __future__ import annotations

import os
from typing import Any

from voice.agent.providers.base import Provider, ProviderError
from voice.agent.providers.scripted import ScriptedProvider
from voice.errors import UsageError


def make_provider(spec: str, config: dict[str, Any]) -> Provider:
    """Build the provider named by `spec`: "scripted:FILE", an http(s) URL of
    an OpenAI-compatible server, "openai" (the configured base_url) or "auto"."""
    llm = config["llm"]
    if spec.startswith("scripted:"):
        try:
            return ScriptedProvider.from_file(spec.removeprefix("scripted:"))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    from voice.agent.providers.openai_compat import OpenAICompatibleProvider

    if spec.startswith(("http://", "https://")):
        base_url = spec
    elif spec in ("openai", "auto"):
        base_url = llm["base_url"]
    else:
        raise UsageError(f"--llm {spec!r}: expected an http(s) URL, 'scripted:FILE', 'openai' or 'auto'")
    return OpenAICompatibleProvider(
        base_url=base_url,
        model=llm["model"],
        api_key=os.environ.get(llm["api_key_env"]) or None,
        timeout_s=llm["timeout_s"],
    )


async def ensure_reachable(provider: Provider, spec: str) -> None:
    """Fail fast, with the fix, when a server-backed provider cannot be reached."""
    check = getattr(provider, "check_reachable", None)
    if check is None:
        return
    try:
        await check()
    except ProviderError as exc:
        hint = "" if spec != "auto" else " (no offline provider yet: pass --llm scripted:FILE)"
        raise UsageError(f"{exc}{hint}") from None


__all__ = ["Provider", "ProviderError", "make_provider", "ensure_reachable"]
