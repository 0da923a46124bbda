"""The one streaming interface every language-model provider implements.

A provider turns a model request (messages + tool schemas) into an async
iterator of deltas. It raises `ProviderError` for anything that went wrong on
the provider's side (HTTP status, refused connection, a stream that broke off
or ended without a finish reason); vendor exceptions never leak past it.

Cancellation: iterating observes cancellation at every await; a provider must
release its connection when the iterator is closed (`aclose()`), which the
agent loop does in a `finally`.
"""

from __future__ import annotations

import re

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from voice.log.events import ToolResult


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of one tool call. `index` says which call; `id` and `name`
    arrive once (usually on the first piece), `arguments` is a JSON fragment."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class OtherDelta:
    """A delta of a kind this project does not interpret (e.g. a refusal or
    audio). Kept in the record, never in model history."""

    kind: str
    data: Any = None


@dataclass(frozen=True)
class Finish:
    """The provider said the stream is complete. `reason` as the provider
    gave it: "stop", "tool_calls", "length", ..."""

    reason: str


Delta = TextDelta | ReasoningDelta | ToolCallDelta | OtherDelta | Finish


class ProviderError(Exception):
    """A request failed on the provider's side. `retryable` tells the loop
    whether another attempt may help (connection trouble, 5xx, 429)."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = True):
        super().__init__(message)
        self.status = status
        self.retryable = retryable

    @property
    def context_exceeded(self) -> bool:
        """The server refused the request as longer than its context (llama.cpp:
        HTTP 400 "This model's maximum context length is ...", code
        context_length_exceeded; docs/llm-servers.md). A shorter request may pass."""
        return self.status in (400, 413) and _CONTEXT_REFUSAL.search(str(self)) is not None


_CONTEXT_REFUSAL = re.compile(r"context[ _](length|window|size)|maximum context|too many tokens|prompt is too long",
                              re.IGNORECASE)


@dataclass(frozen=True)
class ProviderRoute:
    """Where a request went, recorded on every assistant message/attempt."""

    provider: str
    model: str
    base_url: str | None = None


@dataclass(frozen=True)
class ModelRequest:
    messages: Sequence[dict[str, Any]]  # OpenAI-style chat messages: what a model reads
    tools: Sequence[dict[str, Any]] = field(default_factory=tuple)
    # The structured result behind each "tool" message, by its tool_call_id:
    # a provider that acts on results (the skills provider) reads their
    # status and receipt here, never the text rendered for a model.
    tool_results: Mapping[str, ToolResult] = field(default_factory=dict)
    max_tokens: int | None = None  # a cap on the reply (a cache-warming request asks for one token)


@runtime_checkable
class Provider(Protocol):
    route: ProviderRoute

    def stream(self, request: ModelRequest) -> AsyncIterator[Delta]:
        """Start the request and yield its deltas, ending with `Finish`.
        Raises `ProviderError` on failure (also mid-stream)."""
        ...

    async def aclose(self) -> None: ...


# What a provider may also do. Asked with `isinstance(provider, <one of these>)`: declared here,
# so a misspelt capability fails type checks instead of silently turning a feature off.


@runtime_checkable
class CountsTokens(Protocol):
    """A provider whose server counts tokens with the model's own tokenizer."""

    async def count_tokens(self, text: str) -> int | None:
        """Tokens in `text`; None when the server could not say."""
        ...


@runtime_checkable
class ChecksReachable(Protocol):
    """A provider that can tell, before the first turn, whether its server answers."""

    async def check_reachable(self) -> None:
        """Raises `ProviderError` (naming the fix) when the server does not answer."""
        ...
