"""Fixtures every tier may use: the Cloud Storage emulator."""

from __future__ import annotations

import pytest

from tests import gcsemulator


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """The bucket gcsemulator.BUCKET in a real Cloud Storage emulator; its URL (STORAGE_EMULATOR_HOST)."""
    with gcsemulator.emulator(tmp_path_factory.mktemp("gcs") / "emulator.log") as url:
        yield url
