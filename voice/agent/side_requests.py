"""Model requests off a turn's path: a summary of the turns that left the
window (voice.agent.summary) and a request that warms the server's prompt
cache. Each runs in idle time, after a reply ended, is filed under the turn
it followed at a step of its own (1000, 1001: a turn's own steps are below
them), so `voice trace TURN` shows it, and is never history: what the
person hears comes only from a turn's own requests.

Warming the prompt cache: after the window moved (or took a new summary),
the next turn's request begins with a prefix the server has never seen,
and it would evaluate all of it while the person waits. One request with
that prefix and a one-token reply, sent while the person is silent, has
the server evaluate it then. The same once when the service starts
(voice.agent.moving_window's `warm_first`; not recorded): the system prompt
and the tool schemas alone are some 500 tokens (SmolLM2's tokens, the
built-in tools), about a second of a 2-core CPU, which the first request
would otherwise wait for:

- llama.cpp (llama-server; llama-cpp-python's server) keeps the KV cache of
  the prompt it evaluated last and reuses its longest common prefix with
  the next one: the next turn evaluates only its own words.
- Ollama (llama.cpp underneath) keeps the KV cache of the last prompt per
  loaded model and reuses a matching prefix the same way.
- vLLM's automatic prefix caching (on by default in the V1 engine) keeps
  the KV blocks of earlier prompts by hash and reuses a matching prefix.

A server without such a cache only spends a little idle time on it;
`llm.warm_cache = false` turns it off.
"""

from __future__ import annotations

from dataclasses import replace

import anyio

from voice.agent import turn_rows as rows
from voice.agent.providers.base import ModelRequest, Provider, ProviderError, TextDelta
from voice.agent.turn_rows import Place
from voice.log import events as ev
from voice.log.store import EventStore

SUMMARY_STEP = 1000  # the step a summary request is recorded under
WARM_STEP = 1001  # the step a cache-warming request is recorded under


def route_of(provider: Provider) -> ev.Route:
    r = provider.route
    return {"provider": r.provider, "model": r.model, "base_url": r.base_url}


async def ask(store: EventStore, provider: Provider, place: Place, request: ModelRequest, message_id: str) -> str | None:
    """Stream `request` to its end and return its text; None when it failed,
    recorded as an `assistant/attempt` (reason error) with its
    `agent/request-error` at `place`. Cancellable: a cancel records nothing."""
    text: list[str] = []
    stream = provider.stream(request)
    try:
        async for delta in stream:
            if isinstance(delta, TextDelta):
                text.append(delta.text)
    except ProviderError as exc:
        rows.attempt(store, place, "error", message_id=message_id, content=[], route=route_of(provider))
        rows.request_failed(store, place, str(exc), exc.status, exc.retryable)
        return None
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
            await stream.aclose()
    return "".join(text)


async def warm(store: EventStore, provider: Provider, conversation: str, turn: int | None,
               request: ModelRequest) -> bool:
    """Send `request` (the next turn's prefix) for one token, so the server
    holds it evaluated; recorded as an `assistant/attempt` with reason
    `warm` (its token is no reply: never history), filed under `turn`, the
    turn it followed. True when it was answered.

    `turn` None: the service has just started, and nothing is recorded. A
    row would make the conversation the latest one, so that opening an old
    conversation and leaving it at once would change which one the next
    start resumes (a hostile tester's finding)."""
    request = replace(request, max_tokens=1)
    if turn is None:
        return await _unrecorded(provider, request)
    place = Place(conversation, turn, WARM_STEP, 0)
    if await ask(store, provider, place, request, f"warm_{turn}") is None:
        return False
    rows.attempt(store, place, "warm", message_id=f"warm_{turn}", content=[], route=route_of(provider))
    return True


async def _unrecorded(provider: Provider, request: ModelRequest) -> bool:
    """Stream `request` to its end, keeping nothing; False when it failed."""
    stream = provider.stream(request)
    try:
        async for _delta in stream:
            pass
    except ProviderError:
        return False
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
            await stream.aclose()
    return True
