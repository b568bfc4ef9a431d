"""A local stand-in for vLLM's OpenAI-compatible server (stdlib HTTP on 127.0.0.1): each chat request gets the next
scripted behaviour, so tests can make the "model" hang, drop the connection, fail or answer anything."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion(content: str, finish: str = "stop", prompt_tokens: int = 11, completion_tokens: int = 7) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
    return {"id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "fake", "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


class FakeLLM(ThreadingHTTPServer):
    """Answers each chat request with the next behaviour (the last one repeats): "hang", "drop" (close without an
    answer), an HTTP status code, (status, error message), a JSON body (dict) or an HTML one (other str). Records the requests and how many were in flight at once."""

    def __init__(self, *behaviours, delay_s: float = 0.0, health: bool = True, max_model_len: int | None = None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.behaviours = list(behaviours) or [completion("OK", finish="length")]
        self.delay_s, self.health, self.max_model_len = delay_s, health, max_model_len
        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.lock, self.release = threading.Lock(), threading.Event()
        self.url = f"http://127.0.0.1:{self.server_port}/v1"

    def next(self):
        with self.lock:
            return self.behaviours.pop(0) if len(self.behaviours) > 1 else self.behaviours[0]


class _Handler(BaseHTTPRequestHandler):
    server: FakeLLM

    def log_message(self, *args):
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health" and self.server.health:
            self._json(200, {})
        elif self.path == "/v1/models":
            model = {"id": "fake", "object": "model", "owned_by": "test"}
            if self.server.max_model_len:
                model["max_model_len"] = self.server.max_model_len
            self._json(200, {"object": "list", "data": [model]})
        else:
            self._json(404, {"error": {"message": "no such path"}})

    def do_POST(self):
        s = self.server
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with s.lock:
            s.requests.append(request)
            s.in_flight += 1
            s.max_in_flight = max(s.max_in_flight, s.in_flight)
        time.sleep(s.delay_s)
        what = s.next()
        with s.lock:
            s.in_flight -= 1
        if what == "hang":
            s.release.wait()
        elif what == "drop":
            pass  # HTTP/1.0: returning without a response closes the connection
        elif isinstance(what, int):
            self._json(what, {"error": {"message": "boom", "type": "InternalServerError"}})
        elif isinstance(what, tuple):  # (status, message): an error the way vLLM words it
            self._json(what[0], {"error": {"message": what[1], "type": "BadRequestError"}})
        elif isinstance(what, str):  # e.g. a proxy's HTML page
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(what.encode())
        else:
            self._json(200, what)


