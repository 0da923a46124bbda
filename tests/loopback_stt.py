"""A loopback OpenAI-compatible transcription server for tests: a real
HTTP/1.1 server on 127.0.0.1, in a thread of the test process, answering
`POST /v1/audio/transcriptions` (multipart: file, model, language,
response_format) with real faster-whisper (tiny.en) behind it, as the
faster-whisper servers do: `json` ({"text"}) or `verbose_json` (text and
segments with their log-probabilities)."""

from __future__ import annotations

import io
import json
import threading
import wave
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from loopback_llm import send_reply


class LoopbackStt:
    def __init__(self, model: str = "tiny.en"):
        from faster_whisper import WhisperModel

        from voice.speech import models

        self._whisper = WhisperModel(str(models.whisper_tiny_en()), device="cpu", compute_type="int8", cpu_threads=2)
        self.requests: list[dict[str, Any]] = []  # the form fields of each request (the file as its length)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path.rstrip("/") != "/v1/audio/transcriptions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                fields = _form(self.headers.get("content-type", ""), body)
                server.requests.append({k: (len(v) if k == "file" else v.decode()) for k, v in fields.items()})
                self._send(200, server.transcribe(fields))

            def _send(self, status: int, obj: dict[str, Any]) -> None:
                send_reply(self, status, "application/json", json.dumps(obj).encode())

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    def transcribe(self, fields: dict[str, bytes]) -> dict[str, Any]:
        with wave.open(io.BytesIO(fields["file"])) as w:
            audio = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768
        segments, _ = self._whisper.transcribe(audio, language=fields.get("language", b"en").decode(), beam_size=1,
                                               temperature=0.0, condition_on_previous_text=False,
                                               without_timestamps=True)
        segments = list(segments)
        text = " ".join(s.text.strip() for s in segments).strip()
        if fields.get("response_format", b"json").decode() != "verbose_json":
            return {"text": text}
        return {"task": "transcribe", "language": "en", "duration": len(audio) / 16000, "text": text,
                "segments": [{"id": i, "seek": 0, "start": s.start, "end": s.end, "text": s.text, "tokens": [],
                              "temperature": 0.0, "avg_logprob": s.avg_logprob,
                              "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}
                             for i, s in enumerate(segments)]}

    def __enter__(self) -> LoopbackStt:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(5)


def _form(content_type: str, body: bytes) -> dict[str, bytes]:
    """The fields of a multipart/form-data body."""
    message = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    return {part.get_param("name", header="content-disposition"): part.get_payload(decode=True)
            for part in message.iter_parts()}
