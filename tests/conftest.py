"""Fixtures every tier may use: the Cloud Storage emulator, the Compute Engine API stand-in, an MLflow server."""

from __future__ import annotations

import os
import re
import signal

import pytest

from tests import computestub, fabfork, gcsemulator, gcslayer

# Where PYTHONDONTWRITEBYTECODE is set (the sandbox this project is built in sets it), every Python the tests start
# (fab; each campaign case's driver, runners and tools; MaxText's validator) would compile its modules again: they
# keep their bytecode, as on a user's machine and a VM. Read as a Python starts: xdist's workers start after this.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# Tests press Ctrl-C (SIGINT) on what they start, as a terminal would. A shell starts a background command with SIGINT
# ignored, and an ignored signal stays ignored in every child: `pytest &` would then test a Ctrl-C that did nothing
# (fab tensorboard never ended). The default again, here and so in what the tests start (xdist's workers included).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

fabfork.ENABLED = True  # the tests' fab forked (tests/fabfork.py); the benchmarks start it as a user does
ONE_WORKER = ("tests/unit/test_tracking.py",)  # modules run whole on one worker: their fixtures are costly
RELEASE = re.compile(r"\[(?:[^]]*-)?(\d+\.\d+\.\d+)(?:-[^]]*)?\]$")  # a test id's MaxText release: [0.2.3]


@pytest.hookimpl(optionalhook=True)  # xdist's hook: the TPU tier's venv has no xdist
def pytest_xdist_make_scheduler(config, log):
    """With workers (-n, the default `--dist load`): each test on its own, but for the MaxText CPU tier, whose tests
    of one module and release share one run (a module fixture) and read it in file order: each such module and
    release is one unit, on one worker; and the trackers' module, whose tests share one MLflow server (15 s to
    start on a busy machine: once, not once a worker). (xdist's own `--dist loadgroup` names its groups through a
    field pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneRunOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(ONE_WORKER):
                return nodeid.partition("::")[0]
            if not nodeid.startswith("tests/maxtext_cpu/"):
                return nodeid
            module, _, test = nodeid.partition("::")
            release = RELEASE.search(test)
            return f"{module}[{release[1]}]" if release else module

    return OneRunOneWorker(config, log)


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """The bucket gcsemulator.BUCKET in a real Cloud Storage emulator, behind the layer that adds what
    the emulator lacks (tests/gcslayer.py); the URL to point clients at (gcsemulator.client_env)."""
    with gcsemulator.emulator(tmp_path_factory.mktemp("gcs") / "emulator.log") as url, gcslayer.layer(url) as layered:
        yield layered


@pytest.fixture(scope="session")
def compute():
    """The Compute Engine API stand-in: the stack's instance, its status and its SSH host keys."""
    state, server = computestub.serve()
    yield state
    server.shutdown()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server's URL (tests/mlflowserver.py; imported here: the TPU tier's venv has no
    matplotlib, which the MLflow logger's module brings)."""
    from tests import mlflowserver

    with mlflowserver.server(tmp_path_factory.mktemp("mlflow")) as url:
        yield url
