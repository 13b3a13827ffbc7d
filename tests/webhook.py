"""A webhook receiver on 127.0.0.1, as Slack's or ntfy's would be: what each POST carried (results.notify)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A webhook receiver on 127.0.0.1: what each POST carried; `delay` seconds before it answers `status`."""

    def __init__(self, delay: float = 0.0, status: int = 200):
        self.posts: list[dict] = []
        self.delay, self.status = delay, status
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                time.sleep(receiver.delay)
                receiver.posts.append({"path": self.path, "body": json.loads(body), "at": time.monotonic()})
                self.send_response(receiver.status)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.secret = uuid.uuid4().hex  # in the URL's path, as a Slack webhook's secret is
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook/{self.secret}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
