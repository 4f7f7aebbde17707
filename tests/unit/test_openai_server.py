"""tests/openai_server.py, the OpenAI-compatible model the Chat panel's browser test serves, run as a
subprocess on a free 127.0.0.1 port: the model list, a JSON answer, a streamed one (OpenAI's chunks, one
word per event, arriving apart, then [DONE]) and the 400s for what is not a chat request."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

SERVER = Path(__file__).resolve().parents[1] / "openai_server.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def base():
    port = _free_port()
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "OPENAI_SERVER_DELAY": "0.1"}
    proc = subprocess.Popen([sys.executable, str(SERVER)], env=env, cwd=SERVER.parent)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            requests.get(f"{url}/v1/models", timeout=2)
            break
        except requests.ConnectionError:
            assert proc.poll() is None, "the server exited"
            assert time.monotonic() < deadline, "the server did not listen within 20 s"
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def _chat(base, body, **kw):
    return requests.post(f"{base}/v1/chat/completions", json=body, timeout=30, **kw)


def test_lists_one_model(base):
    r = requests.get(f"{base}/v1/models", timeout=10)
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["echo-chat"]


def test_answers_the_last_user_message_as_json(base):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "You said: first"},
        {"role": "user", "content": "hello there"},
    ]
    r = _chat(base, {"model": "echo-chat", "messages": messages})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "You said: hello there"}
    assert answer["choices"][0]["finish_reason"] == "stop"


def test_streams_one_word_per_event_then_done(base):
    body = {"messages": [{"role": "user", "content": "one two three"}], "stream": True}
    events: list[tuple[float, str]] = []
    with _chat(base, body, stream=True) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for line in r.iter_lines(decode_unicode=True):
            if line:
                assert line.startswith("data: "), line
                events.append((time.monotonic(), line[len("data: ") :]))
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"].get("content") for c in chunks]
    assert deltas == ["", "You", " said:", " one", " two", " three", None]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # The words arrive apart, not all at the end.
    times = [t for t, _ in events]
    assert times[-1] - times[1] >= 0.3, times


@pytest.mark.parametrize(
    "data, why",
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "JSON object"),
        (b"{}", "'messages' must be a non-empty list"),
        (b'{"messages": []}', "'messages' must be a non-empty list"),
        (b'{"messages": ["hi"]}', "'role'"),
        (b'{"messages": [{"role": "system", "content": "x"}]}', "role 'user'"),
    ],
)
def test_refuses_what_is_not_a_chat_request(base, data, why):
    r = requests.post(
        f"{base}/v1/chat/completions", data=data, headers={"Content-Type": "application/json"}, timeout=10
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert why in error["message"] and error["type"] == "invalid_request_error"


def test_unknown_paths_are_404(base):
    assert requests.get(f"{base}/nothing", timeout=10).status_code == 404
    assert requests.post(f"{base}/v1/completions", json={}, timeout=10).status_code == 404
