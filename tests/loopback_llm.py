"""A loopback OpenAI-compatible server for tests that run `voice` as a
process: a real HTTP/1.1 server on 127.0.0.1 streaming chat-completion
chunks as Ollama sends them, in a thread of the test process.

It answers "note: TEXT" with an `add_note` call, any other user message
with `get_time`, and tool results with "Saved." Tool-call ids are what
servers really do: `ids="omit"` sends none (the client falls back to
"call_0"), `ids="repeat"` sends "call_0" in every response.

`n_ctx` makes it refuse a request whose messages hold n_ctx tokens or more
as llama.cpp does (HTTP 400, its message and code, docs/llm-servers.md),
counting a token per two characters: a tokenizer that finds more tokens
than the assistant's estimate, as a real one may.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "qwen3:8b"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1732900000, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n".encode()


def send_reply(handler: BaseHTTPRequestHandler, status: int, kind: str, data: bytes) -> None:
    """One whole response, then the connection closes (as the loopback servers answer)."""
    handler.send_response(status)
    handler.send_header("Content-Type", kind)
    handler.send_header("Content-Length", str(len(data)))
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(data)


class LoopbackLLM:
    def __init__(self, ids: str = "omit", n_ctx: int | None = None):
        self.ids = ids
        self.n_ctx = n_ctx
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # GET /v1/models: the reachability probe
                self._send(200, "application/json", json.dumps({"object": "list", "data": []}).encode())

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                if not self.path.endswith("/chat/completions"):  # e.g. a tokenizer endpoint: Ollama has none
                    self._send(404, "application/json", b'{"error": "not found"}')
                    return
                server.requests.append(body)
                tokens = sum(len(json.dumps(m)) for m in body["messages"]) // 2
                if server.n_ctx is not None and tokens >= server.n_ctx:
                    message = (f"This model's maximum context length is {server.n_ctx} tokens. However, you requested "
                               f"{tokens} tokens ({tokens} in the messages, 0 in the completion). Please reduce the "
                               "length of the messages or completion.")
                    error = {"error": {"message": message, "type": "invalid_request_error", "param": "messages",
                                       "code": "context_length_exceeded"}}
                    self._send(400, "application/json", json.dumps(error).encode())
                    return
                self._send(200, "text/event-stream", b"".join(server.reply(body["messages"])) + b"data: [DONE]\n\n")

            def _send(self, status: int, kind: str, data: bytes) -> None:
                send_reply(self, status, kind, data)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    def reply(self, messages: list[dict[str, Any]]) -> list[bytes]:
        last = messages[-1]
        if str(messages[0].get("content", "")).startswith("Summarise"):
            return [_chunk({"role": "assistant", "content": "The person chatted about numbers."}), _chunk({}, "stop")]
        if str(last.get("content", "")).startswith("chat: "):
            return [_chunk({"role": "assistant", "content": "Noted."}), _chunk({}, "stop")]
        if last["role"] == "tool":
            return [_chunk({"role": "assistant", "content": "Saved."}), _chunk({}, "stop")]
        note = re.match(r"note: (.*)", str(last.get("content", "")))
        name, args = ("add_note", {"text": note[1]}) if note else ("get_time", {})
        call: dict[str, Any] = {"index": 0, "type": "function", "function": {"name": name, "arguments": ""}}
        if self.ids == "repeat":
            call["id"] = "call_0"
        return [_chunk({"role": "assistant", "tool_calls": [call]}),
                _chunk({"tool_calls": [{"index": 0, "function": {"arguments": json.dumps(args)}}]}),
                _chunk({}, "tool_calls")]

    def __enter__(self) -> LoopbackLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
