"""What every task shares (bootstrap/tasks/common.py)."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest

from bootstrap.errors import UserError
from bootstrap.tasks import common


@pytest.fixture
def first_session(monkeypatch):
    """As in a fresh fab: no session opened yet; what it froze is this test process's own again after."""
    monkeypatch.setattr(common, "_frozen", False)
    yield
    gc.unfreeze()
    gc.enable()


@pytest.mark.parametrize("failing", [False, True], ids=["opened", "failed"])
def test_a_session_opens_without_collections_and_they_resume_after(first_session, failing: bool):
    """Off while a session opens (its imports and objects live on); a command that runs for hours after (fab train
    following a run) collects its garbage again, and so does one whose opening ended in an error."""
    with pytest.raises(UserError) if failing else contextlib.nullcontext(), common._no_collection():
        assert not gc.isenabled()
        if failing:
            raise UserError("a check failed")
    assert gc.isenabled()


class Connection:
    """A cycle, as a dropped session's SSH connection is (paramiko's Transport)."""

    def __init__(self):
        self.me = self


def test_a_later_sessions_dropped_connection_is_collected(first_session):
    """fab train --watch opens a session per recovery: each frozen too, a dropped one would live until exit."""
    with common._no_collection():
        pass  # the first session: frozen
    with common._no_collection():
        assert gc.isenabled()
        dropped = weakref.ref(Connection())
    gc.collect()
    assert dropped() is None


def test_a_line_is_printed_as_it_is(capsys):
    """rich's emoji codes are off: it made a job's `state:x:` "state❌"."""
    common.console.print("state:x: in gs://bucket/:fire:/model")
    assert capsys.readouterr().out == "state:x: in gs://bucket/:fire:/model\n"
