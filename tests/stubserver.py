"""Serve a stand-in's HTTP handler on 127.0.0.1 in a daemon thread (the Hub and Compute Engine stand-ins)."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer


def start(state, handler_for) -> ThreadingHTTPServer:
    """Serve `handler_for(state)` on a free port; `state.url` is set to its address."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(state))
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
