"""A small OpenAI-compatible upstream on 127.0.0.1 for the plug-in's own tests: each server answers
in one `mode` (its stream's empty role chunk at once, or with the first token when
`role_late`) — "ok", "drop" (the stream breaks after its second token), "429" (with
Retry-After: 7), "500", "503", "400", "hang" (answers nothing for 30 s). The system tests use vitals'
upstream simulator instead."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _chunk(content=None, finish=None):
    delta = {} if content is None else {"content": content}
    return "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "sim",
                                  "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"


def _role_chunk():
    return "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "sim",
                                  "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                               "finish_reason": None}]}) + "\n\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _json(self, status, obj, headers=()):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        with self.server.lock:
            self.server.requests += 1
        mode = self.server.mode
        if mode == "hang":
            time.sleep(30)
            return
        if mode == "429":
            return self._json(429, {"error": {"message": "slow down", "type": "rate_limit"}}, [("retry-after", "7")])
        if mode == "429r":
            # OpenAI's headers, no Retry-After: the request limit ran out and resets in 1.5 s.
            return self._json(429, {"error": {"message": "slow down", "type": "rate_limit"}},
                              [("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-remaining-tokens", "8000"),
                               ("x-ratelimit-reset-requests", "1.5s"), ("x-ratelimit-reset-tokens", "6m0s")])
        if mode in ("500", "503", "400"):
            return self._json(int(mode), {"error": {"message": f"answered {mode}"}})
        if not body.get("stream"):
            return self._json(200, {"id": "c", "object": "chat.completion", "created": 1, "model": "sim",
                                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                                 "finish_reason": "stop"}],
                                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def send(text):
            b = text.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
            self.wfile.flush()

        if not self.server.role_late:
            send(_role_chunk())  # at once, as many upstreams do: the first token comes later
        time.sleep(self.server.ttft_s)
        if self.server.role_late:
            send(_role_chunk())
        for i in range(3):
            send(_chunk(f"t{i} "))
            if mode == "drop" and i == 1:
                self.connection.shutdown(2)
                return
        send(_chunk(finish="stop"))
        send("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")


class Upstream:
    def __init__(self, mode="ok", ttft_s=0.05, role_late=False):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.mode = mode
        self.server.ttft_s = ttft_s
        self.server.role_late = role_late
        self.server.requests = 0  # chat completions asked of it
        self.server.lock = threading.Lock()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def requests(self) -> int:
        with self.server.lock:
            return self.server.requests

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def refused_url():
    """A loopback URL where nothing listens (bound, then closed)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"
