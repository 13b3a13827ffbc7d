"""Fixtures for the real-SSH tests: the loopback host, the Hub stand-in, and `fab` against them."""

from __future__ import annotations

import uuid

import pytest

from tests import gcsemulator, hubstub
from tests.loopback import REPO, Fab, loopback_host, write_test_jobs


def pytest_collection_modifyitems(items):
    for item in items:
        if "/tests/ssh/" in str(item.fspath):
            item.add_marker(pytest.mark.ssh)


@pytest.fixture(scope="session")
def ssh_host(tmp_path_factory, gcs_emulator):
    """The "VM", which reaches the Cloud Storage emulator (tests/conftest.py) as a VM reaches its bucket."""
    with loopback_host(tmp_path_factory.mktemp("sshd"), gcsemulator.client_env(gcs_emulator)) as host:
        yield host


def _served(stub):
    """A stand-in's state while its server runs."""
    state, server = stub.serve()
    yield state
    server.shutdown()


@pytest.fixture(scope="session")
def hub():
    """The Hub stand-in both ends use: fab's token preflight and the upload job on the "VM"."""
    yield from _served(hubstub)


@pytest.fixture
def fab(ssh_host, hub, tmp_path) -> Fab:
    jobs = tmp_path / "jobs"
    write_test_jobs(jobs, tmp_path, [str(REPO / "tests" / "standin")])
    token = "hf_test" + uuid.uuid4().hex
    hub.tokens[token] = hubstub.Token()
    return Fab(ssh_host, tmp_path, token, jobs, hub)
