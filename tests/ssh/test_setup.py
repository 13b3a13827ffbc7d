"""fab setup for real: uv, a Python 3.12 venv and maxtext 0.2.3 from PyPI on the loopback host.

The test spec leaves out the tpu-post-train extra (it needs the PyTorch CPU index and
GitHub) and the extra-deps step; everything else is the reference's section 2.
"""

from __future__ import annotations

import re
import subprocess
import uuid

import pytest
import yaml

from bootstrap.remote import gcs
from tests import gcsemulator
from tests.loopback import Fab, write_test_jobs
from tests.stack import wipe


def test_real_setup_then_the_same_spec_is_a_no_op_and_a_changed_one_rebuilds(fab: Fab):
    write_test_jobs(fab.jobs, fab.tmp, ["maxtext==0.2.3"])
    first = fab("setup", timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "setup: starting" in first.stdout
    python = fab.tmp / "venv" / "bin" / "python"
    version = subprocess.run(
        [
            python,
            "-c",
            "import sys, importlib.metadata as m; print(sys.version_info[:2], m.version('maxtext'), m.version('pip'))",
        ],
        capture_output=True,
        text=True,
    )
    assert version.stdout.startswith("(3, 12) 0.2.3 "), version  # pip is there: the venv was seeded

    again = fab("setup")
    assert again.returncode == 0, again.stderr
    assert "setup: done already" in again.stdout
    assert "starting" not in again.stdout

    pipeline = yaml.safe_load((fab.jobs / "pipeline.yaml").read_text())
    pipeline["environment"]["packages"].append("six")
    (fab.jobs / "pipeline.yaml").write_text(yaml.safe_dump(pipeline))
    changed = fab("setup", timeout=900)
    assert changed.returncode == 0, changed.stderr
    assert "setup: starting" in changed.stdout
    assert (
        subprocess.run(
            [python, "-c", "import six, importlib.metadata as m; assert m.version('maxtext') == '0.2.3'"]
        ).returncode
        == 0
    )


@pytest.fixture
def bucket(gcs_emulator, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)  # this test's reads of the bucket


def test_a_new_vm_restores_the_environment_kept_in_the_bucket_instead_of_building_it(fab: Fab, bucket):
    """The first VM builds and keeps its venv in the bucket; a new VM (no state, no venv) restores it, the build
    not run, and its jobs run in it; a corrupt part makes the next new VM build again, said in one line."""
    write_test_jobs(fab.jobs, fab.tmp, ["six==1.16.0"])
    durable = ("--arg", f"vars.durable_dir=gs://{gcsemulator.BUCKET}/{uuid.uuid4().hex[:8]}/model")
    first = fab("setup", *durable, timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "[setup] packages six" in first.stdout and "environment kept in gs://" in first.stdout
    python = fab.tmp / "venv" / "bin" / "python"
    built = {p.relative_to(fab.tmp): p.read_bytes() for p in (fab.tmp / "venv").rglob("*") if p.is_file()}

    wipe(fab)
    restored = fab("setup", *durable, timeout=900)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "environment restored from gs://" in restored.stdout and "[setup] packages six" not in restored.stdout
    assert {p.relative_to(fab.tmp): p.read_bytes() for p in (fab.tmp / "venv").rglob("*") if p.is_file()} == built
    assert subprocess.run([python, "-c", "import six; assert six.__version__ == '1.16.0'"]).returncode == 0

    kept = re.search(r"environment kept in (gs://\S+) \(", first.stdout).group(1)  # this spec's, this VM's
    gcs.write(gcs.names(f"{kept}/parts/")[0], b"not what was kept")
    wipe(fab)
    rebuilt = fab("setup", *durable, timeout=900)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert re.search(r"environment: building it \(parts/\S+ is corrupt", rebuilt.stdout)
    assert "[setup] packages six" in rebuilt.stdout
    assert subprocess.run([python, "-c", "import six"]).returncode == 0
