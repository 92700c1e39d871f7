"""A stand-in for real servers' habits the sim pod on main does not have yet.

Until the sim pod's habit profiles land (admission-real: `--health-path ""`,
`--api-prefix ""`, the serial and keeps-computing profiles), integration tests
use this small threaded HTTP/1.1 server on 127.0.0.1 (port from the OS). Its
habits, each a constructor argument:

- `health_path`: None serves no health endpoint (404), as the serial
  llama.cpp-style server issue 12 measured;
- `prefix`: "" serves /chat/completions, /completions, /embeddings, /models
  without /v1 (as many embeddings servers do);
- `serial`: one request computes at a time, first come first served;
- it always keeps computing after the client disconnects (a thread sleeping
  out its service time), so `busy_until` says when the backend's work ends;
- `loading_s`: every path it serves answers 503 for that long after start.

Service time = base_ms + ms_per_prompt_token * prompt + ms_per_output_token * output,
with prompt tokens = ceil(chars / 4) and output = max_tokens (default 16); the
answer reports them in `usage`, as OpenAI servers do.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StandIn:
    def __init__(
        self,
        *,
        health_path: str | None = None,
        prefix: str = "",
        serial: bool = True,
        base_ms: float = 5.0,
        ms_per_prompt_token: float = 0.0,
        ms_per_output_token: float = 2.0,
        loading_s: float = 0.0,
    ) -> None:
        self.health_path, self.prefix, self.serial = health_path, prefix, serial
        self.base_ms, self.ms_per_prompt_token, self.ms_per_output_token = (
            base_ms,
            ms_per_prompt_token,
            ms_per_output_token,
        )
        self.ready_at = time.monotonic() + loading_s
        self.lock = threading.Lock()  # the serial engine
        self.busy_until = 0.0  # monotonic time the last computation ends
        self.requests: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def service_ms(self, prompt_tokens: int, output_tokens: int) -> float:
        return self.base_ms + self.ms_per_prompt_token * prompt_tokens + self.ms_per_output_token * output_tokens

    def _compute(self, seconds: float) -> None:
        if self.serial:
            with self.lock:
                self.busy_until = time.monotonic() + seconds
                time.sleep(seconds)
        else:
            self.busy_until = max(self.busy_until, time.monotonic() + seconds)
            time.sleep(seconds)

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go in two writes: no 40 ms delayed-ACK stall

            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, status: int, obj) -> None:
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:  # the client left; the work was done anyway
                    pass

            def do_GET(self) -> None:
                standin.requests.append(f"GET {self.path}")
                served = (standin.health_path, standin.prefix + "/models")
                if self.path not in served:
                    return self._send(404, {"error": "not found"})
                if time.monotonic() < standin.ready_at:
                    return self._send(503, {"error": "loading"})
                if self.path == standin.health_path:
                    return self._send(200, {"status": "ok"})
                self._send(200, {"object": "list", "data": [{"id": "standin", "object": "model"}]})

            def do_POST(self) -> None:
                standin.requests.append(f"POST {self.path}")
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                kind = {
                    standin.prefix + "/chat/completions": "chat",
                    standin.prefix + "/completions": "completions",
                    standin.prefix + "/embeddings": "embeddings",
                }.get(self.path)
                if kind is None:
                    return self._send(404, {"error": "not found"})
                if time.monotonic() < standin.ready_at:
                    return self._send(503, {"error": "loading"})
                try:
                    body = json.loads(raw)
                except ValueError:
                    return self._send(400, {"error": "bad json"})
                prompt, output = _tokens(kind, body)
                standin._compute(standin.service_ms(prompt, output) / 1000.0)
                usage = {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}
                if kind == "embeddings":
                    return self._send(200, {"object": "list", "data": [{"embedding": [0.0] * 4}], "usage": usage})
                choice = {"index": 0, "finish_reason": "length"}
                if kind == "chat":
                    choice["message"] = {"role": "assistant", "content": "x " * output}
                else:
                    choice["text"] = "x " * output
                self._send(200, {"object": kind, "choices": [choice], "usage": usage})

        return Handler


def _tokens(kind: str, body: dict) -> tuple[int, int]:
    if kind == "chat":
        text = "".join(m.get("content") or "" for m in body.get("messages", []) if isinstance(m.get("content"), str))
    else:
        value = body.get("prompt" if kind == "completions" else "input", "")
        text = value if isinstance(value, str) else " ".join(map(str, value))
    prompt = math.ceil(len(text) / 4)
    output = 0 if kind == "embeddings" else int(body.get("max_tokens") or 16)
    return prompt, output
