"""Reach the VM while the laptop still checks the jobs: a command's connection, begun first.

Importing and checking the jobs (pydantic and the schema) takes about 0.1 s, and so do the SSH handshake
and starting the VM's answer to the first look (facts.py); a command paid both, one after the other. The
dial does the second in a thread, begun before the task imports the first (tasks/common.py): it finds the
VM as connect.py does (-H, or the Pulumi stack's outputs), opens the connection and starts facts.py, which
waits for its request and changes nothing until it comes. What it found, or the error it met, is handed
over where the task asks for it, so the local checks' errors still come first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import paramiko
from fabric import Connection
from invoke import Context

from .. import beside
from . import connect, machine


class Dial:
    """The stack's outputs, then the open connection and facts.py started, found in a thread of their own.

    `connects=False` reads the outputs only (--recover: the VM may be gone, and is recreated first); a gke
    stack's cluster is never dialled here.
    """

    def __init__(self, c: Context, say: Callable[[str], None], connects: bool = True):
        self._c, self._say, self._connects = c, say, connects
        self._outputs: dict | None = None
        self._conn: Connection | None = None
        self._asking: paramiko.Channel | None = None
        self._outputs_error: BaseException | None = None
        self._connect_error: BaseException | None = None
        self._outputs_read, self._done = threading.Event(), threading.Event()
        beside.start(self._reach)  # a command that fails its own checks exits without waiting for the connection

    def _reach(self) -> None:
        try:
            self._outputs = None if isinstance(self._c, Connection) else connect.stack_outputs()
        except BaseException as err:  # noqa: BLE001 - raised where the task asks for the outputs
            self._outputs_error = err
        self._outputs_read.set()
        try:
            if self._outputs_error is None and self._connects and (self._outputs or {}).get("backend") != "gke":
                conn = connect.connection(self._c, self._say, self._outputs)
                self._conn = connect.open_connection(conn, self._outputs)
                self._asking = machine.start_asking(self._conn)
        except BaseException as err:  # noqa: BLE001 - raised where the task asks for the connection
            self._connect_error = err
        self._done.set()

    def outputs(self) -> dict | None:
        """The Pulumi stack's outputs (None with -H)."""
        self._outputs_read.wait()
        if self._outputs_error is not None:
            raise self._outputs_error
        return self._outputs

    def host(self) -> str:
        """The host it connects to, as given (-H, or the stack's `hosts` output)."""
        outputs = self.outputs()
        return self._c.host if outputs is None else ",".join(outputs.get("hosts") or [])

    def connection(self) -> tuple[Connection, paramiko.Channel | None]:
        """The open connection, and facts.py started on it (None if that failed: `Vm.ask` starts it then)."""
        self.outputs()
        self._done.wait()
        if self._connect_error is not None:
            raise self._connect_error
        assert self._conn is not None, "a dial that reads the outputs only has no connection"
        return self._conn, self._asking
