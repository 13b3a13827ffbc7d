"""fab setup for real: uv, a Python 3.12 venv and maxtext 0.2.3 from PyPI on the loopback host.

The test spec leaves out the tpu-post-train extra (it needs the PyTorch CPU index and
GitHub) and the extra-deps step; everything else is the reference's section 2.
"""

from __future__ import annotations

import subprocess

import yaml

from tests.loopback import Fab, write_test_jobs


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
