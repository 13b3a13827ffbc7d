"""maxtext_run.py runs a module as `python -m` would and closes a grader pool the module left open.

The real case (MaxText 0.2.3's train_rl never exiting once its math_verify pool graded an
answer) is exercised by the real CPU tier, whose rewards make the pool start."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from bootstrap.paths import REPO
from bootstrap.remote import attempts

LAUNCHER = REPO / "bootstrap" / "remote" / "maxtext_run.py"


def run(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "entry.py").write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, LAUNCHER, "entry", *args],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},  # the module is found in the working folder, as `python -m` finds it
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_module_runs_as_main_with_its_arguments_and_its_exit_status(tmp_path):
    result = run(
        tmp_path,
        """
        import sys
        if __name__ == "__main__":
            print(sys.argv[1:], sys.argv[0].endswith("entry.py"))
            sys.exit(3)
        """,
        "model_name=x",
        "--flag=1",
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout == "['model_name=x', '--flag=1'] True\n"
    assert "closed" not in result.stderr  # no pool, nothing said


def test_a_pool_left_open_is_closed_and_its_workers_are_gone(tmp_path):
    """A spawned pool in the grader module's slot, as train_rl leaves it: the launcher closes and joins it."""
    result = run(
        tmp_path,
        """
        import multiprocessing, sys, types
        module = types.ModuleType("maxtext.trainers.post_train.rl.math_verify_pool")
        sys.modules[module.__name__] = module

        def square(x):
            return x * x

        if __name__ == "__main__":
            module._POOL = multiprocessing.get_context("spawn").Pool(2)
            print(module._POOL.map(square, [2, 3]), [p.pid for p in module._POOL._pool], flush=True)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert "closed MaxText's math_verify grader pool so that entry can exit" in result.stderr
    squares, pids = result.stdout.split("] [")
    assert squares == "[4, 9"
    for pid in pids.strip("]\n").split(", "):
        assert not Path(f"/proc/{pid}").exists()  # joined: no worker left behind


def test_a_missing_module_is_one_line_as_python_m_says_it(tmp_path):
    result = subprocess.run([sys.executable, LAUNCHER, "no_such_module"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip() == f"{sys.executable}: No module named no_such_module"


def test_a_failure_with_the_pool_open_ends_at_once_with_its_status(tmp_path):
    result = run(
        tmp_path,
        """
        import multiprocessing, sys, types
        module = types.ModuleType("maxtext.trainers.post_train.rl.math_verify_pool")
        sys.modules[module.__name__] = module
        if __name__ == "__main__":
            module._POOL = multiprocessing.get_context("spawn").Pool(1)
            raise RuntimeError("training failed")
        """,
    )
    assert result.returncode == 1
    assert "RuntimeError: training failed" in result.stderr


def test_each_start_is_recorded_before_the_module_runs_with_the_step_it_resumes_from(tmp_path):
    """The record is there when the trainer starts (a VM lost at any later point keeps it), and names the
    last committed checkpoint step: folders 1 and 2 are committed, 3.orbax-checkpoint-tmp is not."""
    checkpoints = tmp_path / "run" / "checkpoints" / "actor"
    for name in ("1", "2", "3.orbax-checkpoint-tmp-123"):
        (checkpoints / name).mkdir(parents=True)
    records = tmp_path / "run" / "attempts"
    (tmp_path / "entry.py").write_text(
        "import json, pathlib, sys\n"
        f"found = [json.loads(p.read_text()) for p in pathlib.Path({str(records)!r}).glob('*.json')]\n"
        "print(json.dumps(found))\n"
    )
    env = {"PATH": "/usr/bin:/bin", attempts.DIR_ENV: str(records), attempts.CHECKPOINTS_ENV: str(checkpoints)}
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, LAUNCHER, "entry"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)  # what the second start saw as it began: both starts' records
    assert [record["resumed_from"] for record in seen] == [2, 2]
    assert len(attempts.parse([p.read_text() for p in records.glob("*.json")])) == 2


def test_a_start_that_cannot_be_recorded_still_trains_and_says_why(tmp_path):
    (tmp_path / "in-the-way").write_text("a file where the records' folder would be")
    (tmp_path / "entry.py").write_text("print('trained')\n")
    env = {"PATH": "/usr/bin:/bin", attempts.DIR_ENV: str(tmp_path / "in-the-way" / "attempts")}
    result = subprocess.run([sys.executable, LAUNCHER, "entry"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "trained\n"
    assert "[tpu-rl] could not record this start in" in result.stderr
