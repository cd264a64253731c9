"""vitals' HTTP ingest (`POST /v1/signals`) as far as the plug-in uses it, on 127.0.0.1: it accepts
every item and keeps it, so that a test can read what a LiteLLM proxy in another process
reported."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Ingest:
    def __init__(self):
        self.items = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                with outer._lock:
                    outer.items.extend(body.get("items", []))
                data = json.dumps({"items": [{"status": "accepted"} for _ in body.get("items", [])]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self) -> list:
        with self._lock:
            return list(self.items)

    def close(self):
        self.server.shutdown()
        self.server.server_close()
