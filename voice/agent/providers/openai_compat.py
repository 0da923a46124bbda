"""Provider for OpenAI-compatible chat completions (Ollama, llama.cpp, vLLM, OpenAI).

Cancellation propagates untouched (only `Exception` subclasses are translated).
Whichever way the generator ends (exhausted, error, cancelled, `aclose()`), the
SDK stream is closed in a shielded `finally`, releasing the HTTP connection.
Vendor and transport exceptions are turned into `ProviderError` here, once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpcore2
import httpx2
import openai

from voice.agent.providers.base import (
    Delta,
    Finish,
    ModelRequest,
    OtherDelta,
    ProviderError,
    ProviderRoute,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)

# Transport errors that may escape the SDK unwrapped (e.g. while it reads an error body).
_TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    httpx2.HTTPError,
    httpx2.StreamError,
    httpcore2.ProtocolError,
    httpcore2.NetworkError,
    httpcore2.TimeoutException,
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    OSError,
)
# Everything this provider translates; anything else (a bug, cancellation) passes through.
_TRANSLATED = (openai.OpenAIError, json.JSONDecodeError, UnicodeDecodeError, *_TRANSPORT_ERRORS)
_REASONING_FIELDS = ("reasoning_content", "reasoning")
_CLOSE_TIMEOUT_S = 2.0
_REACHABLE_TIMEOUT_S = 2.0


class OpenAICompatibleProvider:
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.extra_body = dict(extra_body) if extra_body else None
        self.route = ProviderRoute(provider="openai", model=model, base_url=base_url)
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or "not-needed",
            timeout=timeout_s,
            max_retries=0,
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[Delta]:
        kwargs: dict[str, Any] = {"model": self.model, "messages": list(request.messages), "stream": True}
        if request.tools:
            kwargs["tools"] = list(request.tools)
        if request.max_tokens is not None:
            kwargs["max_tokens"] = request.max_tokens
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        try:
            sdk_stream = await self._client.chat.completions.create(**kwargs)
        except _TRANSLATED as e:
            raise self._translate(e, started=False) from e

        finish: str | None = None
        chunks = 0
        try:
            async for chunk in sdk_stream:
                chunks += 1
                try:  # (the SDK builds chunks without checking them: a server's odd one surfaces here)
                    if not chunk.choices:  # usage-only chunk
                        continue
                    choice = chunk.choices[0]
                    deltas = _deltas(choice.delta) if choice.delta is not None else []
                    ended = choice.finish_reason
                except (AttributeError, TypeError, IndexError, KeyError) as e:
                    raise ProviderError(
                        f"the model server sent a chunk that is not a chat-completion chunk ({e}): "
                        f"{_shown(chunk)}; it must speak OpenAI's streaming format", retryable=False) from None
                for delta in deltas:
                    yield delta
                if ended is not None and finish is None:
                    finish = str(ended)
                    yield Finish(finish)
        except _TRANSLATED as e:
            raise self._translate(e, started=True) from e
        finally:
            # Shielded: a cancelled consumer must still release the connection.
            with anyio.move_on_after(_CLOSE_TIMEOUT_S, shield=True):
                try:
                    await sdk_stream.close()
                except _TRANSPORT_ERRORS:
                    pass
        if finish is None:
            if chunks == 0:
                await self._raise_refusal(kwargs)
            raise ProviderError("stream ended without a finish reason", retryable=True)

    async def _raise_refusal(self, kwargs: dict[str, Any]) -> None:
        """A 200 stream that carried no chunk at all: the server failed the
        request after accepting it. llama.cpp's Python server does this when
        it refuses a streamed request (a prompt over its context length); its
        refusal only ever comes as the answer to a request that is not
        streamed. So ask once more, not streamed and for one token, and raise
        the refusal if that is what comes back (a 400 is then not retried).
        One SDK retry: the pooled connection the failed stream used may be one
        the server has closed."""
        probe = {**kwargs, "stream": False, "extra_body": {**(self.extra_body or {}), "max_tokens": 1}}
        try:
            await self._client.with_options(max_retries=1).chat.completions.create(**probe)
        except openai.APIStatusError as e:
            raise self._translate(e, started=False) from e
        except _TRANSLATED:
            return  # no clearer answer: the caller reports the empty stream

    async def count_tokens(self, text: str) -> int | None:
        """The server's own count of `text`'s tokens, with the model's own
        tokenizer: llama-cpp-python's POST /extras/tokenize/count, else the
        C++ llama-server's POST /tokenize. None where the server has neither
        (Ollama, most hosted APIs) or does not answer within 2 s."""
        root = self.base_url.rstrip("/").removesuffix("/v1")
        for path, body, read in (("/extras/tokenize/count", {"input": text}, lambda r: r["count"]),
                                 ("/tokenize", {"content": text}, lambda r: len(r["tokens"]))):
            try:
                with anyio.fail_after(_REACHABLE_TIMEOUT_S):
                    response = await self._client._client.post(root + path, json=body)
                if response.status_code == 200:
                    return int(read(response.json()))
            except (TimeoutError, ValueError, KeyError, TypeError, *_TRANSPORT_ERRORS):
                continue
        return None

    async def aclose(self) -> None:
        await self._client.close()

    async def check_reachable(self) -> None:
        """Raise ProviderError when nothing answers at base_url; any HTTP answer is fine."""
        try:
            await self._client.models.list(timeout=_REACHABLE_TIMEOUT_S)
        except openai.APITimeoutError as e:  # something listens there and says nothing: most often a busy server
            raise ProviderError(
                f"the language model at {self.base_url} did not answer within {_REACHABLE_TIMEOUT_S:g} s (busy with "
                "another reply? a llama.cpp server answers nothing else until that reply ends); wait for it and "
                "try again, or pass --llm scripted:FILE",
                retryable=True,
            ) from e
        except (openai.APIConnectionError, *_TRANSPORT_ERRORS) as e:
            raise ProviderError(
                f"cannot reach the language model at {self.base_url} ({_describe(e)}); "
                "start the server or pass --llm scripted:FILE",
                retryable=True,
            ) from e
        except (openai.OpenAIError, ValueError):
            return  # it answered (404, 401, odd body): reachable

    def _translate(self, e: Exception, *, started: bool) -> ProviderError:
        if isinstance(e, openai.APIStatusError):
            status = e.status_code
            return ProviderError(
                f"the language model at {self.base_url} answered HTTP {status}: {_server_message(e)}",
                status=status,
                retryable=status == 429 or status >= 500,
            )
        if isinstance(e, (openai.APIConnectionError, *_TRANSPORT_ERRORS)):
            if started:
                return ProviderError(f"the language model stream broke off: {_describe(e)}", retryable=True)
            return ProviderError(
                f"cannot reach the language model at {self.base_url}: {_describe(e)}", retryable=True
            )
        if isinstance(e, openai.APIError):  # an error event inside the stream
            return ProviderError(f"the language model reported an error: {e.message}", retryable=True)
        # Other SDK errors, or a chunk that is not JSON / not UTF-8.
        return ProviderError(f"bad response from the language model: {_describe(e)}", retryable=True)


def _deltas(delta: Any) -> list[Delta]:
    out: list[Delta] = []
    extra = getattr(delta, "model_extra", None) or {}
    for name in _REASONING_FIELDS:
        value = getattr(delta, name, None) or extra.get(name)
        if isinstance(value, str) and value:
            out.append(ReasoningDelta(value))
            break
    if delta.content is not None and not isinstance(delta.content, str):
        raise TypeError(f"its content is {type(delta.content).__name__}, not text")
    if delta.content:
        out.append(TextDelta(delta.content))
    if getattr(delta, "refusal", None):
        out.append(OtherDelta("refusal", delta.refusal))
    for position, call in enumerate(delta.tool_calls or ()):
        index = getattr(call, "index", None)
        function = getattr(call, "function", None)
        out.append(
            ToolCallDelta(
                index=index if isinstance(index, int) else position,
                id=getattr(call, "id", None),
                name=getattr(function, "name", None),
                arguments=getattr(function, "arguments", None) or "",
            )
        )
    return out


def _shown(chunk: Any) -> str:
    """A chunk as the server sent it, cut short for a one-line error."""
    try:
        text = json.dumps(chunk.model_dump(exclude_unset=True))
    except Exception:  # noqa: BLE001 - an object the SDK could not even dump: its repr says what it is
        text = repr(chunk)
    return text if len(text) <= 160 else text[:157] + "..."


def _server_message(e: openai.APIStatusError) -> str:
    body = e.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    if isinstance(body, str) and body:
        return body
    return e.message


def _describe(e: BaseException) -> str:
    """The root cause, e.g. 'ConnectionResetError: [Errno 104] Connection reset by peer'."""
    found, seen = e, 0
    cur: BaseException | None = e
    while cur is not None and seen < 8:  # the SDK wraps httpx2 wraps httpcore2 wraps h11/anyio
        if str(cur):
            found = cur
        cur, seen = cur.__cause__ or cur.__context__, seen + 1
    return f"{type(found).__name__}: {found}" if str(found) else type(found).__name__
