"""A scripted, OpenAI-compatible chat-completions server for tests and benchmarks.

`ScriptedLLM` runs a stdlib `ThreadingHTTPServer` in a daemon thread on 127.0.0.1 (a port the
OS picks) and answers `POST /v1/chat/completions` from a script: a sequence of `Reply`s served
in order, or a function of the request body. Every request body is recorded, and the usage it
reported is totalled, so a caller can assert on what was asked and what it would have cost
without a network, a key or a model.

    with ScriptedLLM([Reply(status=429, headers={"retry-after": "0"}), Reply(content="ok")]) as llm:
        OpenAI(base_url=llm.url, api_key="test").chat.completions.create(...)
        assert llm.calls == 2
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

# Ideographs (with extensions and compatibility forms), kana, hangul, CJK punctuation and
# full-width forms: scripts a BPE tokenizer spends about one token per character on.
_CJK = re.compile(
    "[\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
    "\U00020000-\U0002fa1f]"
)
_CHARS_PER_TOKEN = 4
# How long close() waits for handlers still answering: long enough for a woken one to finish
# writing, short enough that a handler stuck on a silent client never hangs a test.
_CLOSE_GRACE_S = 2.0
_CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
_MODELS_PATH = "/v1/models"
# OpenAI's error "type"/"code" for the statuses clients treat specially; others derive from the phrase.
_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate: each CJK character is one token, other text one token per 4 characters
    (rounded up)."""
    cjk = len(_CJK.findall(text))
    other = len(text) - cjk
    return cjk + -(-other // _CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Reply:
    """One scripted answer. A non-200 status sends an OpenAI-style error body with `content` as its message."""

    content: str = ""
    status: int = 200
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


Script = Callable[[dict[str, Any]], Reply]


def _text(content: object) -> str:
    """A message's text: a plain string, or the text parts of a content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [m for m in messages if isinstance(m, dict)]


def _purpose(body: dict[str, Any]) -> str:
    for message in _messages(body):
        if message.get("role") == "system":
            lines = _text(message.get("content")).splitlines()
            return lines[0] if lines else ""
    return ""


def _error_body(status: int, message: str) -> dict[str, Any]:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:  # a status the stdlib has no name for, e.g. a provider's 529
        phrase = "Error"
    default_type = "server_error" if status >= 500 else "invalid_request_error"
    kind, code = _ERROR_KINDS.get(status, (default_type, phrase.lower().replace(" ", "_")))
    return {"error": {"message": message or phrase, "type": kind, "param": None, "code": code}}


class _Server(ThreadingHTTPServer):
    # Handler threads must never keep the interpreter alive after a test forgets close().
    daemon_threads = True

    def __init__(self, llm: ScriptedLLM) -> None:
        self.llm = llm
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0 (the default) closes each connection after its answer, so no handler thread is
    # left blocked reading an idle keep-alive connection when the server stops.
    server_version = "ScriptedLLM/1.0"

    @property
    def llm(self) -> ScriptedLLM:
        return cast(_Server, self.server).llm

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: a test's output is no place for one access-log line per request."""

    # do_GET/do_POST: the names BaseHTTPRequestHandler dispatches to.
    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != _MODELS_PATH:
            self._send(404, _error_body(404, f"no route GET {self.path}"))
            return
        model = {"id": self.llm.model, "object": "model", "created": 0, "owned_by": "memflow"}
        self._send(200, {"object": "list", "data": [model]})

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] not in _CHAT_PATHS:
            self._send(404, _error_body(404, f"no route POST {self.path}"))
            return
        body = self._read_json()
        if body is None:
            self._send(400, _error_body(400, "request body is not a JSON object"))
            return
        answer = self.llm._answer(body)
        if answer is not None:
            status, payload, headers = answer
            self._send(status, payload, headers)

    def _read_json(self) -> dict[str, Any] | None:
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        except (ValueError, UnicodeDecodeError):
            return None
        return body if isinstance(body, dict) else None

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (its timeout ran out during a delay): nobody is left to answer.
            self.close_connection = True


class ScriptedLLM:
    """An in-process OpenAI-compatible server answering chat completions from a script."""

    def __init__(self, script: Script | Sequence[Reply] | None = None, model: str = "scripted") -> None:
        self.model = model
        self._script = script if callable(script) else None
        self._queue = list(script) if script is not None and not callable(script) else None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._closing = threading.Event()
        self._requests: list[dict[str, Any]] = []
        self._in_flight = 0
        self._prompt_tokens = 0
        self._completion_tokens = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ScriptedLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> ScriptedLLM:
        if self._closing.is_set():
            raise RuntimeError("a closed ScriptedLLM cannot be restarted: make a new one")
        if self._server is None:
            self._server = _Server(self)
            # A short poll interval: shutdown() waits up to one interval, and tests start and stop servers often.
            self._thread = threading.Thread(
                target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="scripted-llm", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving; wakes every handler still in its delay, so this never waits out a slow reply."""
        self._closing.set()
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0, timeout=_CLOSE_GRACE_S)

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("ScriptedLLM is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._requests)

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self._requests)

    @property
    def in_flight(self) -> int:
        """Chat requests received and not yet answered (or abandoned)."""
        with self._lock:
            return self._in_flight

    @property
    def prompt_tokens(self) -> int:
        with self._lock:
            return self._prompt_tokens

    @property
    def completion_tokens(self) -> int:
        with self._lock:
            return self._completion_tokens

    def purposes(self) -> list[str]:
        """Per request, the first line of its first system message: callers tell prompt kinds apart by it."""
        return [_purpose(body) for body in self.requests]

    def _answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]] | None:
        """Status, JSON body and headers for one chat request; None when the server closed during its delay."""
        with self._lock:
            self._requests.append(body)
            self._in_flight += 1
            n = len(self._requests)
        try:
            reply = self._reply(body)
            # An Event, not time.sleep: close() cuts a slow reply short instead of waiting it out.
            if reply.delay_s > 0 and self._closing.wait(reply.delay_s):
                return None
            if reply.status != 200:
                return reply.status, _error_body(reply.status, reply.content), reply.headers
            return 200, self._completion(n, body, reply), reply.headers
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    def _reply(self, body: dict[str, Any]) -> Reply:
        if self._script is not None:
            try:
                return self._script(body)
            except Exception as exc:  # a broken script is a 500 the test can see, not a dropped connection
                return Reply(status=500, content=f"script raised {exc!r}")
        with self._lock:
            if self._queue is None:
                return Reply(content="{}")
            if not self._queue:
                return Reply(status=500, content=f"script exhausted: no reply left for request {len(self._requests)}")
            return self._queue.pop(0)

    def _completion(self, n: int, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        prompt = reply.prompt_tokens
        if prompt is None:
            prompt = estimate_tokens("\n".join(_text(m.get("content")) for m in _messages(body)))
        completion = reply.completion_tokens
        if completion is None:
            completion = estimate_tokens(reply.content)
        with self._lock:
            self._prompt_tokens += prompt
            self._completion_tokens += completion
        return {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": reply.content}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }
