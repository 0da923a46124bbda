"""OpenAICompatibleProvider against the real openai client over a real loopback
socket: a tiny HTTP/1.1 server replays recorded SSE chunks (as OpenAI/Ollama send
them), breaks off, answers errors, or holds the stream open."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from autojump import on_autojump
from voice.agent.providers.base import (
    Finish,
    ModelRequest,
    Provider,
    ProviderError,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from voice.agent.providers.openai_compat import OpenAICompatibleProvider

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]

MODEL = "qwen3:8b"
MESSAGES = [
    {"role": "system", "content": "You are a voice assistant."},
    {"role": "user", "content": "Hello"},
]
TIMER_TOOL = {
    "type": "function",
    "function": {
        "name": "set_timer",
        "description": "Start a countdown timer.",
        "parameters": {
            "type": "object",
            "properties": {"seconds": {"type": "integer"}, "label": {"type": "string"}},
            "required": ["seconds"],
        },
    },
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- the fake server -------------------------------------------------------------


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-614",
        "object": "chat.completion.chunk",
        "created": 1732900000,
        "model": MODEL,
        "system_fingerprint": "fp_ollama",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


USAGE_CHUNK = {
    "id": "chatcmpl-614",
    "object": "chat.completion.chunk",
    "created": 1732900000,
    "model": MODEL,
    "choices": [],
    "usage": {"prompt_tokens": 21, "completion_tokens": 3, "total_tokens": 24},
}


@dataclass
class Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    method: str
    path: str
    body: Any

    async def start_sse(self) -> None:
        self.writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        await self.writer.drain()

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await self.writer.drain()

    async def send(self, obj: dict[str, Any]) -> None:
        await self.send_raw(f"data: {json.dumps(obj)}\n\n".encode())

    async def done(self) -> None:
        await self.send_raw(b"data: [DONE]\n\n")
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()

    async def respond_json(self, status: int, reason: str, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await self.writer.drain()

    async def wait_closed_by_peer(self, timeout: float) -> bool:
        try:
            return await asyncio.wait_for(self.reader.read(1), timeout) == b""
        except (ConnectionError, asyncio.IncompleteReadError):
            return True
        except TimeoutError:
            return False


Handler = Callable[[Conn], Awaitable[None]]


@dataclass
class FakeServer:
    handler: Handler
    requests: list[Conn] = field(default_factory=list)
    peer_closed: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    _server: asyncio.Server | None = None
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> FakeServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, path, _ = request_line.split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            conn = Conn(reader, writer, method, path, json.loads(raw) if raw else None)
            self.requests.append(conn)
            await self.handler(conn)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def collect(provider: OpenAICompatibleProvider, request: ModelRequest, out: list[Any]) -> None:
    with anyio.fail_after(5):
        async for delta in provider.stream(request):
            out.append(delta)


async def run(handler: Handler, request: ModelRequest | None = None, **kw: Any) -> tuple[list[Any], FakeServer]:
    """Stream one request against a fresh server; returns the deltas and the server."""
    out: list[Any] = []
    async with FakeServer(handler) as server:
        provider = OpenAICompatibleProvider(server.base_url, MODEL, timeout_s=5, **kw)
        try:
            await collect(provider, request or ModelRequest(messages=MESSAGES), out)
        finally:
            await provider.aclose()
    return out, server


# --- tests -----------------------------------------------------------------------


def test_satisfies_the_provider_protocol() -> None:
    provider = OpenAICompatibleProvider("http://127.0.0.1:9/v1", MODEL)
    assert isinstance(provider, Provider)
    assert provider.route.provider == "openai"
    assert provider.route.model == MODEL
    assert provider.route.base_url == "http://127.0.0.1:9/v1"


async def test_text_streams_in_order_then_finish() -> None:
    async def handler(conn: Conn) -> None:
        await conn.start_sse()
        await conn.send(chunk({"role": "assistant", "content": ""}))
        for piece in ["Hel", "lo", " there", "."]:
            await conn.send(chunk({"content": piece}))
        await conn.send(chunk({}, finish="stop"))
        await conn.send(USAGE_CHUNK)
        await conn.done()

    out, server = await run(handler, extra_body={"options": {"num_ctx": 8192}})

    assert out == [TextDelta("Hel"), TextDelta("lo"), TextDelta(" there"), TextDelta("."), Finish("stop")]
    [req] = server.requests
    assert (req.method, req.path) == ("POST", "/v1/chat/completions")
    assert req.body["model"] == MODEL
    assert req.body["messages"] == MESSAGES
    assert req.body["stream"] is True
    assert "tools" not in req.body
    assert req.body["options"] == {"num_ctx": 8192}


@pytest.mark.parametrize("field_name", ["reasoning_content", "reasoning"])
async def test_reasoning_comes_before_text(field_name: str) -> None:
    async def handler(conn: Conn) -> None:
        await conn.start_sse()
        await conn.send(chunk({"role": "assistant", "content": "", field_name: "The user"}))
        await conn.send(chunk({"content": "", field_name: " greets me."}))
        await conn.send(chunk({"content": "Hi!"}))
        await conn.send(chunk({}, finish="stop"))
        await conn.done()

    out, _ = await run(handler)

    assert out == [ReasoningDelta("The user"), ReasoningDelta(" greets me."), TextDelta("Hi!"), Finish("stop")]


async def test_tool_call_split_over_chunks() -> None:
    fragments = ['{"seconds":', ' 300, "label": ', '"tea"}']

    async def handler(conn: Conn) -> None:
        await conn.start_sse()
        first = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"index": 0, "id": "call_9f2", "type": "function", "function": {"name": "set_timer", "arguments": ""}}
            ],
        }
        await conn.send(chunk(first))
        for fragment in fragments:
            await conn.send(chunk({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}))
        await conn.send(chunk({}, finish="tool_calls"))
        await conn.done()

    out, server = await run(handler, ModelRequest(messages=MESSAGES, tools=(TIMER_TOOL,)))

    assert out[0] == ToolCallDelta(index=0, id="call_9f2", name="set_timer", arguments="")
    assert out[1:4] == [ToolCallDelta(index=0, arguments=f) for f in fragments]
    assert out[-1] == Finish("tool_calls")
    assert len(out) == 5
    arguments = "".join(d.arguments for d in out if isinstance(d, ToolCallDelta))
    assert json.loads(arguments) == {"seconds": 300, "label": "tea"}
    assert server.requests[0].body["tools"] == [TIMER_TOOL]


@pytest.mark.parametrize(
    ("status", "reason", "body", "retryable", "message"),
    [
        (500, "Internal Server Error", {"error": {"message": "model runner crashed", "type": "server_error"}}, True,
         "model runner crashed"),
        (429, "Too Many Requests", {"error": {"message": "slow down", "type": "rate_limit"}}, True, "slow down"),
        (400, "Bad Request", {"error": {"message": "invalid tool schema", "type": "invalid_request_error"}}, False,
         "invalid tool schema"),
        (404, "Not Found", {"error": 'model "qwen9" not found, try pulling it first'}, False,
         'model "qwen9" not found'),
    ],
)
async def test_http_error_status(status: int, reason: str, body: Any, retryable: bool, message: str) -> None:
    async def handler(conn: Conn) -> None:
        await conn.respond_json(status, reason, body)

    with pytest.raises(ProviderError) as caught:
        await run(handler)

    err = caught.value
    assert type(err) is ProviderError
    assert err.status == status
    assert err.retryable is retryable
    assert str(status) in str(err)
    assert message in str(err)


@pytest.mark.parametrize("how", ["fin", "rst"])
@on_autojump  # the 0.3 s before the reset passes only once the loop is idle: the client has read both chunks
async def test_disconnect_mid_stream(how: str) -> None:
    async def handler(conn: Conn) -> None:
        await conn.start_sse()
        await conn.send(chunk({"role": "assistant", "content": "One"}))
        await conn.send(chunk({"content": " two"}))
        if how == "rst":
            await asyncio.sleep(0.3)  # virtual: let the client read the two chunks before the reset
            sock = conn.writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.writer.close()  # no terminating chunk, no [DONE], no finish reason

    out: list[Any] = []
    async with FakeServer(handler) as server:
        provider = OpenAICompatibleProvider(server.base_url, MODEL, timeout_s=5)
        with pytest.raises(ProviderError) as caught:
            await collect(provider, ModelRequest(messages=MESSAGES), out)
        await provider.aclose()

    assert out == [TextDelta("One"), TextDelta(" two")]
    err = caught.value
    assert type(err) is ProviderError
    assert err.retryable is True
    assert err.status is None
    assert "broke off" in str(err)


async def failed_stream(chunks: list[dict[str, Any]], match: str) -> tuple[list[Any], ProviderError]:
    """Stream `chunks` then [DONE]; the deltas that came before the
    ProviderError (matching `match`) the provider raised, and the error."""
    async def handler(conn: Conn) -> None:
        await conn.start_sse()
        for c in chunks:
            await conn.send(c)
        await conn.done()

    out: list[Any] = []
    async with FakeServer(handler) as server:
        provider = OpenAICompatibleProvider(server.base_url, MODEL, timeout_s=5)
        with pytest.raises(ProviderError, match=match) as caught:
            await collect(provider, ModelRequest(messages=MESSAGES), out)
        await provider.aclose()
    return out, caught.value


async def test_done_without_finish_reason_is_an_aborted_finish() -> None:
    out, error = await failed_stream([chunk({"role": "assistant", "content": "Half an ans"})],
                                     "without a finish reason")
    assert out == [TextDelta("Half an ans")]
    assert error.retryable is True


@pytest.mark.parametrize("odd", [
    {**chunk({}), "choices": "zz"},  # (a hostile tester's server; each crashed `voice chat` with a traceback)
    {**chunk({}), "choices": [None]},
    chunk({"role": "assistant", "content": 5}),
], ids=["choices-a-string", "choice-null", "content-a-number"])
async def test_a_chunk_that_is_not_a_chat_completion_chunk_is_a_clear_error(odd: dict[str, Any]) -> None:
    out, error = await failed_stream([odd, chunk({}, "stop")], "not a chat-completion chunk")
    assert out == [] and error.retryable is False
    assert "OpenAI's streaming format" in str(error)


REFUSAL = {"error": {"message": "This model's maximum context length is 1024 tokens. However, you requested 4304 "
                             "tokens (4303 in the messages, 1 in the completion).",
                  "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}


@pytest.mark.parametrize("probe_answer", [400, 200])
async def test_an_empty_stream_is_explained_by_asking_once_without_streaming(probe_answer: int) -> None:
    """llama.cpp's Python server answers a streamed request it refuses (a
    prompt over its context) with 200 and an empty stream; only a request
    that is not streamed gets the refusal (tests/test_llm_server.py shows it
    on the real server)."""
    bodies: list[Any] = []

    async def handler(conn: Conn) -> None:
        bodies.append(conn.body)
        if conn.body.get("stream"):
            await conn.start_sse()
            conn.writer.write(b"0\r\n\r\n")  # the body ends: not one event
            await conn.writer.drain()
        elif probe_answer == 400:
            await conn.respond_json(400, "Bad Request", REFUSAL)
        else:
            await conn.respond_json(200, "OK", {
                "id": "x", "object": "chat.completion", "created": 1, "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "length"}]})

    with pytest.raises(ProviderError) as caught:
        await run(handler, extra_body={"temperature": 0})
    err = caught.value
    # The same request, not streamed, for one token.
    assert [b["stream"] for b in bodies] == [True, False]
    assert bodies[1]["messages"] == bodies[0]["messages"] and bodies[1]["max_tokens"] == 1
    assert bodies[1]["temperature"] == 0
    if probe_answer == 400:
        assert (err.status, err.retryable) == (400, False)
        assert "maximum context length is 1024 tokens" in str(err)
    else:
        assert (err.status, err.retryable) == (None, True)
        assert "without a finish reason" in str(err)


async def test_a_stream_that_carried_chunks_is_not_asked_again() -> None:
    requests: list[Any] = []

    async def handler(conn: Conn) -> None:
        requests.append(conn.body)
        await conn.start_sse()
        await conn.send(chunk({"role": "assistant", "content": "Half"}))
        await conn.done()

    with pytest.raises(ProviderError, match="without a finish reason"):
        await run(handler)
    assert len(requests) == 1


async def test_unreachable_server() -> None:
    base_url = f"http://127.0.0.1:{unused_port()}/v1"
    provider = OpenAICompatibleProvider(base_url, MODEL, timeout_s=5)
    try:
        with anyio.fail_after(5):
            with pytest.raises(ProviderError) as reach:
                await provider.check_reachable()
        assert base_url in str(reach.value)
        assert "--llm scripted:FILE" in str(reach.value)

        out: list[Any] = []
        with pytest.raises(ProviderError) as streamed:
            await collect(provider, ModelRequest(messages=MESSAGES), out)
        assert out == []
        assert type(streamed.value) is ProviderError
        assert base_url in str(streamed.value)
        assert streamed.value.retryable is True
    finally:
        await provider.aclose()


@pytest.mark.parametrize("status", [200, 404])
async def test_check_reachable_accepts_any_http_answer(status: int) -> None:
    async def handler(conn: Conn) -> None:
        body = {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "me"}]}
        await conn.respond_json(status, "OK" if status == 200 else "Not Found", body if status == 200 else {})

    async with FakeServer(handler) as server:
        provider = OpenAICompatibleProvider(server.base_url, MODEL)
        with anyio.fail_after(5):
            assert await provider.check_reachable() is None
        await provider.aclose()
    assert [(r.method, r.path) for r in server.requests] == [("GET", "/v1/models")]


@on_autojump  # the two seconds of silence on the virtual clock: measured there, load cannot stretch them
async def test_check_reachable_gives_up_after_two_seconds_of_silence() -> None:
    async def handler(conn: Conn) -> None:
        await asyncio.sleep(30)  # accepts, never answers

    async with FakeServer(handler) as server:
        provider = OpenAICompatibleProvider(server.base_url, MODEL, timeout_s=30)
        started = anyio.current_time()  # the loop's clock, which the client's timeouts run on
        with anyio.fail_after(6), pytest.raises(ProviderError) as caught:
            await provider.check_reachable()
        elapsed = anyio.current_time() - started
        await provider.aclose()
    assert [(r.method, r.path) for r in server.requests] == [("GET", "/v1/models")]  # it was silence, not a refusal
    assert 1.5 < elapsed < 4
    assert server.base_url in str(caught.value)


def _held_open(server_box: list[FakeServer]) -> Handler:
    async def handler(conn: Conn) -> None:
        await conn.start_sse()
        await conn.send(chunk({"role": "assistant", "content": "Thinking"}))
        if await conn.wait_closed_by_peer(timeout=5):
            server_box[0].peer_closed.set()

    return handler


@on_autojump  # "promptly" measured on the loop's virtual clock, which load cannot stretch
async def test_cancelling_the_consumer_ends_promptly_and_closes_the_connection() -> None:
    box: list[FakeServer] = []
    async with FakeServer(_held_open(box)) as server:
        box.append(server)
        provider = OpenAICompatibleProvider(server.base_url, MODEL, timeout_s=30)
        out: list[Any] = []
        started = anyio.current_time()
        with anyio.move_on_after(0.5) as scope:
            async for delta in provider.stream(ModelRequest(messages=MESSAGES)):
                out.append(delta)
        elapsed = anyio.current_time() - started

        assert scope.cancelled_caught  # cancellation propagated, not turned into an error
        assert out == [TextDelta("Thinking")]
        assert elapsed < 2
        with anyio.fail_after(2):
            await server.peer_closed.wait()
        await provider.aclose()


async def test_closing_the_iterator_early_closes_the_connection() -> None:
    box: list[FakeServer] = []
    async with FakeServer(_held_open(box)) as server:
        box.append(server)
        provider = OpenAICompatibleProvider(server.base_url, MODEL, timeout_s=30)
        with anyio.fail_after(2):
            async with aclosing(provider.stream(ModelRequest(messages=MESSAGES))) as deltas:
                first = await deltas.__anext__()
            assert first == TextDelta("Thinking")
            await server.peer_closed.wait()
        await provider.aclose()
