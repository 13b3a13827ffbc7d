"""What every task shares (bootstrap/tasks/common.py)."""

from __future__ import annotations

import contextlib
import gc

import pytest

from bootstrap.errors import UserError
from bootstrap.tasks import common


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # what the session froze is this test process's own: collected as before


@pytest.mark.parametrize("failing", [False, True], ids=["opened", "failed"])
def test_a_session_opens_without_collections_and_they_resume_after(unfrozen, failing: bool):
    """Off while a session opens (its imports and objects live on); a command that runs for hours after (fab train
    following a run) collects its garbage again, and so does one whose opening ended in an error."""
    with pytest.raises(UserError) if failing else contextlib.nullcontext(), common._no_collection():
        assert not gc.isenabled()
        if failing:
            raise UserError("a check failed")
    assert gc.isenabled()


def test_a_line_is_printed_as_it_is(capsys):
    """rich's emoji codes are off: it made a job's `state:x:` "state❌"."""
    common.console.print("state:x: in gs://bucket/:fire:/model")
    assert capsys.readouterr().out == "state:x: in gs://bucket/:fire:/model\n"
