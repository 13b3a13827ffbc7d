"""The learning-rate schedule `fab plan` predicts is MaxText's own, for each release in conftest.RELEASES: where the
releases differ (an unset schedule's length), the plan follows each one's."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess

import pytest

from bootstrap.jobs import load
from bootstrap.jobs.plan import build
from bootstrap.paths import REPO
from tests.loopback import Fab
from tests.maxtext_cpu.conftest import HERE, Release, script_env, set_up


def shipped_jobs(release: Release) -> load.JobFiles:
    """The shipped jobs/, with the release's maxtext in place of the one pipeline.yaml pins."""
    files = load.read(REPO / "jobs")
    pipeline = copy.deepcopy(files.pipeline)
    packages = pipeline.data["environment"]["packages"]
    pipeline.data["environment"]["packages"] = [
        f"{package.partition('==')[0]}=={release.version}" if package.startswith("maxtext") else package
        for package in packages
    ]
    return dataclasses.replace(files, pipeline=pipeline)


def test_the_local_schedule_is_maxtexts_own(cpu_fab: Fab, release: Release):
    """For the shipped job on this release, the unset schedule (-1), a length equal to base.yml's `steps`, a
    `steps` of its own and changed run lengths: MaxText's pyconfig, its count of the run's updates and
    get_optimizer, stepped through each run, give the rates the plan predicts (in the venv fab setup built)."""
    set_up(cpu_fab, release)
    cases = [
        [],
        ["train.learning_rate_schedule_steps=-1"],
        ["train.rl.num_iterations=2"],
        ["train.train_fraction=0.5"],
        ["train.learning_rate_schedule_steps=150001"],
        ["train.steps=60", "train.learning_rate_schedule_steps=60"],
    ]
    jobs = shipped_jobs(release)
    trains = [build(jobs, case, "r1").job("train") for case in cases]
    real = subprocess.run(
        [release.venv / "bin" / "python", HERE / "maxtext_lr.py"],
        input=json.dumps([train.rendered.argv[3:] for train in trains]),
        capture_output=True,
        text=True,
        env=script_env(),
    )
    assert real.returncode == 0, real.stderr[-3000:]
    results = json.loads(real.stdout)
    for case, train, maxtext in zip(cases, trains, results, strict=True):
        lr = train.lr_schedule
        assert maxtext["train_steps"] == lr.train_steps, case
        assert maxtext["rates"] == pytest.approx([lr.rate(s) for s in range(1, lr.train_steps + 1)], rel=1e-5), case
    assert max(results[1]["rates"]) == pytest.approx(release.unset_schedule_peak, rel=0.01)
