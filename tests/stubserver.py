"""Serve a stand-in's HTTP handler on 127.0.0.1 in a daemon thread (the Hub and Compute Engine stand-ins)."""

from __future__ import annotations

import sys
import threading
from http.server import ThreadingHTTPServer


class QuietServer(ThreadingHTTPServer):
    """A client that went away mid-answer (a fab the test killed) is what the test meant: no traceback in the
    captured output, which a reader of a CI log would take for a failure. Any other error is printed."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def start(state, handler_for) -> ThreadingHTTPServer:
    """Serve `handler_for(state)` on a free port; `state.url` is set to its address."""
    server = QuietServer(("127.0.0.1", 0), handler_for(state))
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
