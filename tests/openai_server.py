"""A small OpenAI-compatible model server, Python stdlib only, for tests and demos.

It runs as an endpoint replica's start command inside a model folder (the tests copy this one file
there), listening on ``$HOST``:``$PORT`` as labfleet sets them (or ``--host``/``--port``).

- ``GET /v1/models``: one model (also the health path of the model definition);
- ``POST /v1/chat/completions``: a deterministic reply, ``You said: <last user message>``, as one
  JSON answer, or with ``"stream": true`` as server-sent events in OpenAI's chunk format, one word per
  event ``DELAY`` seconds apart (``OPENAI_SERVER_DELAY``, 0.15 by default), then ``data: [DONE]``;
- bad JSON, no messages, no user message: 400 with an OpenAI-style error body.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = os.environ.get("OPENAI_SERVER_MODEL", "echo-chat")
DELAY = float(os.environ.get("OPENAI_SERVER_DELAY", "0.15"))
MAX_BODY = 1 << 20


def reply_text(messages: list[dict[str, Any]]) -> str:
    """The answer to a conversation: the last user message, said back."""
    for m in reversed(messages):
        if m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):  # OpenAI's content parts: keep the text ones
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return f"You said: {str(content or '').strip()}"
    raise ValueError("messages has no message with role 'user'")


def check_request(body: Any) -> list[dict[str, Any]]:
    """The messages of a chat completion request; ValueError with the reason otherwise."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise ValueError("each message must be an object with a 'role'")
    return messages


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the replica's log stays short
        pass

    def _json(self, data: Any, code: int = 200) -> None:
        body = json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, message: str, kind: str = "invalid_request_error") -> None:
        self._json({"error": {"message": message, "type": kind, "param": None, "code": None}}, code)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/v1/models", "/models"):
            self._json(
                {
                    "object": "list",
                    "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "labfleet"}],
                }
            )
        else:
            self._error(404, f"no route {path or '/'}", "not_found_error")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            self.close_connection = True
            return self._error(413, "the body is too large")
        raw = self.rfile.read(n)
        if path not in ("/v1/chat/completions", "/chat/completions"):
            return self._error(404, f"no route {path or '/'}", "not_found_error")
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            return self._error(400, "the body is not valid JSON")
        try:
            text = reply_text(check_request(body))
        except ValueError as e:
            return self._error(400, str(e))
        model = body.get("model") or MODEL
        cid = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        created = int(time.time())
        if body.get("stream"):
            return self._stream(cid, created, model, text)
        self._json(
            {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 0, "completion_tokens": len(text.split()), "total_tokens": 0},
            }
        )

    def _stream(self, cid: str, created: int, model: str, text: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def event(delta: dict[str, Any], finish: str | None = None) -> None:
            chunk = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()

        try:
            event({"role": "assistant", "content": ""})
            words = text.split(" ")
            for i, word in enumerate(words):
                time.sleep(DELAY)
                event({"content": word if i == 0 else " " + word})
            event({}, "stop")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller stopped reading (the Chat panel's Stop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT") or 8000))
    args = parser.parse_args()
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
