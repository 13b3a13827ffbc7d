"""MaxText 0.2.3's math_verify grader pool, for real: it is built again, with freshly spawned workers, whenever the
number of items a call grades changes (a train group, an eval batch, a partial last batch); the launcher keeps the
live one (maxtext_run.steady_grader_pool). On the TPU host each build cost 25-30 s and made a 0.35-0.70 s step
take 4.34 s (measured on a TPU host; docs/benchmarks.md). Its workers, spawned, never run train's module again
(maxtext_run.light_grader_workers)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bootstrap.paths import REPO
from tests.maxtext_cpu.conftest import DEFAULT, cpu_fab_at, set_up
from tests.unit.test_maxtext_run import LAUNCHER

CALLS = [1, 2]  # items graded by each call: one group's answers, then an eval batch's, as train and evals do
SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import maxtext_run
from maxtext.trainers.post_train.rl import math_verify_pool as grader

built, build = [], grader._get_pool
def counted(num_procs):  # MaxText's own build, counted where it builds
    if grader._POOL is None or grader._POOL_NUM_PROCS != num_procs:
        built.append(num_procs)
    return build(num_procs)
grader._get_pool = counted
if sys.argv[2] == "steady":
    maxtext_run.steady_grader_pool()  # the launcher's, over MaxText's
maxtext_run.light_grader_workers()  # in both: what a worker loads is the test below's, the builds this one's

class Config:
    reward_exact_answer = 1.0

for count in json.loads(sys.argv[3]):
    items = [(i, ["\\\\boxed{7}"], ["\\\\boxed{7}"]) for i in range(count)]
    scores = grader.math_verify_pool(Config(), items, [0.0] * count, timeout=120)
    assert scores == [1.0] * count, scores
print(json.dumps(built))
grader._shutdown_pool()
"""


@pytest.fixture(scope="module")
def python(cpu_host, tmp_path_factory) -> Path:
    """MaxText 0.2.3's CPU venv, as the tier's `fab setup` builds it: found built in seconds, else built here."""
    with cpu_fab_at(cpu_host, tmp_path_factory.mktemp("grader-setup"), DEFAULT) as fab:
        set_up(fab, DEFAULT)
    return DEFAULT.venv / "bin" / "python"


@pytest.mark.parametrize("launcher", ["maxtext", "steady"])
def test_the_grader_pool_is_built_once_whatever_each_call_grades(python, launcher):
    """`maxtext`: MaxText's own sizing of its pool; `steady`: the launcher's over it (maxtext_run.steady_grader_pool).
    MaxText's builds are counted in both; their workers are light in both (0.2.3's package loads JAX: 9 CPU-s each)."""
    result = subprocess.run(
        [python, "-c", SCRIPT, str(REPO / "bootstrap" / "remote"), launcher, json.dumps(CALLS)],
        capture_output=True, text=True, timeout=600, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    built = json.loads(result.stdout.splitlines()[-1])
    if launcher == "maxtext":
        assert built == CALLS, built  # each change of size spawned a new pool (here: 1, then 2 workers)
    else:
        assert built == [1], built  # the first pool, kept for every later call


ENTRY = """
import json, os, sys
from pathlib import Path
with open(sys.argv[1], "a") as f:  # each process that runs this module: train's, and a worker that runs it again
    f.write(f"{os.getpid()}\\n")
if __name__ == "__main__":
    from multiprocessing import process
    from maxtext.trainers.post_train.rl import math_verify_pool as grader

    started, start = [], process.BaseProcess.start
    def counted(worker):
        started.append(worker.name)
        return start(worker)
    process.BaseProcess.start = counted

    class Config:
        reward_exact_answer = 1.0

    grader._MAX_TASKS_PER_CHILD = 1  # each worker retires after one item: its pool's handler starts another
    items = [(i, ["\\\\boxed{7}"], ["\\\\boxed{7}"]) for i in range(4)]
    # what each process maps: JAX's compiled core, once MaxText's packages loaded it. A worker reads its own, after
    # its start, and retires after one task: the pool's first workers, then replacements.
    def maps():
        return grader._get_pool(2).map(Path.read_text, [Path("/proc/self/maps")] * 2)

    mapped = [Path("/proc/self/maps").read_text(), *maps()]
    assert grader.math_verify_pool(Config(), items, [0.0] * 4, timeout=120) == [1.0] * 4
    size = len(grader._POOL._pool)
    mapped += maps()
    print(json.dumps({"train": os.getpid(), "started": len(started), "size": size,
                      "jax": ["jaxlib" in text for text in mapped]}))
"""


def test_the_graders_workers_never_run_trains_module_again(python, tmp_path):
    """A module in train_rl's place, through the launcher as train runs: MaxText's grader starts its workers, and
    others in place of those that retired; only train's own process ran the module, and none of the workers loaded
    MaxText's packages (0.2.3's load JAX: 8 CPU-s in each worker, at each build and replacement)."""
    (tmp_path / "entry.py").write_text(ENTRY)
    ran = tmp_path / "ran"
    result = subprocess.run(
        [python, LAUNCHER, "entry", ran],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["started"] > found["size"] > 0, found  # workers started when the pool was built, and replacements
    assert ran.read_text().split() == [str(found["train"])], (ran.read_text(), found)
    assert found["jax"] == [True] + [False] * 4, found  # the grader's import loaded JAX in train, in no worker
