"""The TPU tier: where a TPU is (marker `tpu`; pyproject's addopts deselect it everywhere else, CI included)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "/tests/tpu/" in str(item.fspath):
            item.add_marker(pytest.mark.tpu)
