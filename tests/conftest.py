"""Fixtures every tier may use: the Cloud Storage emulator and the Compute Engine API stand-in."""

from __future__ import annotations

import pytest

from tests import computestub, gcsemulator, gcslayer


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
