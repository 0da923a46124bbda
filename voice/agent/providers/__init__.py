"""Language-model providers behind one streaming interface (see base.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager

from voice.agent.providers.base import ChecksReachable, Provider, ProviderError
from voice.agent.providers.scripted import ScriptedProvider
from voice.errors import UsageError, as_usage_error
from voice.paths import config_dir
from voice.settings import LlmSettings

# Marks network I/O as in flight (a replay's autojump clock must not jump over a real server's answer).
Hold = Callable[[], AbstractContextManager[object]]


def make_provider(spec: str, llm: LlmSettings) -> Provider:
    """Build the provider named by `spec`: "scripted:FILE", an http(s) URL of
    an OpenAI-compatible server, "openai" (the configured base_url) or "auto"."""
    if spec.startswith("scripted:"):
        with as_usage_error(ValueError):
            return ScriptedProvider.from_file(spec.removeprefix("scripted:"))
    from voice.agent.providers.openai_compat import OpenAICompatibleProvider

    if spec.startswith(("http://", "https://")):
        base_url = spec
    elif spec in ("openai", "auto"):
        base_url = llm.base_url
    else:
        raise UsageError(f"--llm {spec!r}: expected an http(s) URL, 'scripted:FILE', 'openai' or 'auto'")
    return OpenAICompatibleProvider(
        base_url=base_url,
        model=llm.model,
        api_key=os.environ.get(llm.api_key_env) or None,
        timeout_s=llm.timeout_s,
    )


async def open_provider(spec: str, llm: LlmSettings, notice=lambda text: None, hold: Hold | None = None) -> Provider:
    """The provider for `spec`, checked: a server that cannot be reached is a
    UsageError naming the fix, except for "auto", which then falls back to
    the built-in skills provider (and says so through `notice`). With
    `hold`, the opening and every stream run inside it."""
    if hold is not None:
        with hold():
            return _Held(await open_provider(spec, llm, notice), hold)
    provider = make_provider(spec, llm)
    if not isinstance(provider, ChecksReachable):
        return provider
    try:
        await provider.check_reachable()
    except ProviderError as exc:
        await provider.aclose()
        if spec == "auto":
            from voice.agent.providers.skills import SkillsProvider

            notice(f"no language model answers at {llm.base_url}; using the built-in skills "
                   "(timers, notes, time, commands). For open questions, run Ollama or another "
                   f"OpenAI-compatible server and set llm.base_url and llm.model in {config_dir() / 'voice.toml'} "
                   "(or pass --llm URL --llm-model NAME)")
            return SkillsProvider()
        raise UsageError(str(exc)) from None
    return provider


class _Held:
    """A provider whose waits are network I/O, which an autojump clock does
    not see: held while its stream runs, so a real model's latency is not
    skipped as idle time."""

    def __init__(self, inner: Provider, hold: Hold):
        self.inner, self.hold, self.route = inner, hold, inner.route

    async def stream(self, request):
        with self.hold():
            async for delta in self.inner.stream(request):
                yield delta

    async def aclose(self) -> None:
        await self.inner.aclose()

