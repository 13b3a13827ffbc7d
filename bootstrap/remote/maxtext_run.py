"""Run a MaxText entry point as `python -m MODULE ARGS...` would, then let the process end.

    python maxtext_run.py MODULE ARGS...

MaxText 0.2.3's RL rewards grade answers in a spawned process pool
(trainers/post_train/rl/math_verify_pool.py) that is never closed: at exit its atexit hook
terminates the idle workers, one of which holds the pool's queue lock, and multiprocessing's
own finalizer then waits for that lock forever. train_rl logs "RL Training Completed
Successfully!" and never exits, so its job never ends. This closes the pool the graceful way
(close + join: each worker takes its stop sentinel and exits) once the module returns, keeps
that pool built once (steady_grader_pool), spares its workers train's module (light_grader_workers), and
otherwise changes nothing: same __main__, sys.argv[0] and sys.path[0], same exit status. After a
failure with the pool open, the process ends at once with the module's status. Before the module
runs, the start is recorded where the job's environment says (attempts.py), and each eval it logs from then
on (eval_recorder.py), and with results.wandb its W&B run is named after the run (wandb_run.py). Stdlib only.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import runpy
import sys
import threading
import traceback

try:
    from . import attempts, eval_recorder, eval_sample, gcs, grader_worker, health, health_hooks, jobrunner, wandb_run
except ImportError:
    import attempts  # on the VM and in a pod: beside this script in the tools folder
    import eval_recorder
    import eval_sample
    import gcs
    import grader_worker
    import health
    import health_hooks  # tunix and MaxText themselves imported only as the hooks go in, in train's process
    import jobrunner
    import wandb_run

TASK_ENV = "TPU_RL_TASK"  # a task of your own: its folder on the VM (jobs/task.py)

GRADER_POOL = grader_worker.GRADER_POOL


def steady_grader_pool() -> None:
    """MaxText 0.2.3 sizes its math_verify pool by each call's items (min(8, items, CPUs)) and builds it again,
    with freshly spawned workers, whenever that number changes: every train group, eval batch or partial last
    batch of another size costs a rebuild, 25-30 s on a TPU host. A live pool is kept, whatever size a later
    call asks for (0.2.4 on sizes it by the CPUs alone, so nothing changes there); one that timed out and was
    shut down is built again as before."""
    import multiprocessing.pool  # noqa: F401  0.2.5's module names it in an annotation without importing it

    try:
        grader = importlib.import_module(GRADER_POOL)  # standard library only; train_rl imports it anyway
    except ImportError:  # another module's MaxText, or none
        return
    build = getattr(grader, "_get_pool", None)
    if build is None:
        return

    def steady(num_procs: int):
        return grader._POOL if grader._POOL is not None else build(num_procs)

    grader._get_pool = steady


def light_grader_workers() -> None:
    """A spawned process first runs its parent's __main__ again: here train_rl's module, in every grader worker,
    at each build and each replacement (every 100th task), though a worker needs only the grader's module. The
    grader's own pool runs grader_worker.py in its place, which also spares the worker the grader's packages'
    __init__ (0.2.3's load JAX and MaxText; 0.2.5's load them lazily): the workers spawned while it is built, and
    those its worker handler starts in place of retired ones. Any other pool is spawned as before (0.2.5's train_rl
    pickles its reward class for tunix's pool by __main__)."""
    grader = sys.modules.get(GRADER_POOL)  # loaded by steady_grader_pool where MaxText's RL trainer is
    get_pool = getattr(grader, "_get_pool", None)
    if get_pool is None:
        return
    from multiprocessing import spawn

    prepare, building = spawn.get_preparation_data, set()

    def for_the_grader() -> bool:
        current = threading.current_thread()
        return current in building or current is getattr(grader._POOL, "_worker_handler", None)

    def without_main(name: str) -> dict:
        data = prepare(name)
        if for_the_grader():
            data.pop("init_main_from_name", None)
            data["init_main_from_path"] = os.path.abspath(grader_worker.__file__)
        return data

    def built_light(num_procs: int):
        building.add(threading.current_thread())
        try:
            return get_pool(num_procs)
        finally:
            building.discard(threading.current_thread())

    spawn.get_preparation_data = without_main
    grader._get_pool = built_light


def close_grader_pool() -> bool:
    """Close MaxText's grader pool if the module started one; True if there was one."""
    grader = sys.modules.get(GRADER_POOL)
    pool = getattr(grader, "_POOL", None)
    if pool is None:
        return False
    grader._POOL = None  # its atexit hook then has nothing left to terminate
    pool.close()
    pool.join()
    return True


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__.splitlines()[2].strip())
    module, sys.argv = argv[0], [argv[0], *argv[1:]]
    sys.path[0] = os.getcwd()  # what `python -m` puts first, not this script's folder
    if importlib.util.find_spec(module) is None:
        raise SystemExit(f"{sys.executable}: No module named {module}")
    environ = dict(os.environ)
    stop_record = health.record_path(environ)
    carried_on = still_stopped(stop_record)
    fetch_task_data()
    attempts.record_start(environ)
    recorder = eval_recorder.EvalRecorder.install(environ)
    wandb_run.prepare(run_id=_run_identity())
    steady_grader_pool()
    light_grader_workers()
    hooks = None
    if (rules := health.rules_from(environ, carried_on)) is not None:  # after the grader pool's module is loaded
        hooks = health_hooks.install(rules)
        if recorder is not None:
            recorder.listeners.append(hooks.evaluated)
    if count := eval_sample.batches(environ):
        eval_sample.install(count)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        _said_agreement(hooks)
    except health.Stopped as stop:
        _stop(stop, stop_record)
    except SystemExit as exit_:  # absl's app.run ends train_rl this way, done or not
        if exit_.code in (None, 0):
            _said_agreement(hooks)
        elif _pool_open():
            _exit_now(exit_.code)
        raise
    except BaseException:
        if _pool_open():
            traceback.print_exc()
            _exit_now(1)
        raise
    finally:
        if close_grader_pool():
            print(f"[tpu-rl] closed MaxText's math_verify grader pool so that {module} can exit", file=sys.stderr)


def _said_agreement(hooks) -> None:
    """A train that ended well: its sampler-trainer agreement in one line, where it was measured."""
    if hooks is not None and (line := hooks.watch.summary()):
        health.say(line)


def still_stopped(record: str | None) -> dict | None:
    """A run a health rule stopped stays stopped: its next start ends at once, saying why, unless fab train --go-on
    asked to carry it on (the record then kept, marked cleared). The stop it carries on from, if any: each start
    of a --go-on, a restart's too, so that a smoke stop is not met again before the first step."""
    if os.environ.get(jobrunner.GO_ON_ENV):
        found = health.read_record(record) if record else None
        if found and not found.get("cleared_at"):
            health.clear(record, found)
            health.say(
                f"[tpu-rl] health: carrying on despite the stop at step {found.get('step')} ({found.get('why')})"
            )
        return found
    found = health.stopped(record) if record else None
    if found is None:
        return None
    health.say(
        f"[tpu-rl] health: stopped at step {found.get('step')}: {found.get('why')} (still: fab train --go-on carries "
        "this run on, --new-run starts another)"
    )
    raise SystemExit(jobrunner.STOPPED_EXIT)


def _stop(stop: health.Stopped, record: str | None) -> None:
    """A rule fired: the stop recorded where the run's records are, said, and train ended at once with its last
    committed checkpoint (an async save in flight is not committed, and is never resumed from)."""
    folder = os.environ.get(attempts.CHECKPOINTS_ENV)
    steps = jobrunner.finished_steps(os.path.expanduser(folder)) if folder else []
    committed = steps[-1] if steps else None
    try:
        if record:
            health.write_record(record, stop, committed)
    except Exception as err:  # noqa: BLE001 - the stop stands; only its record is missing
        health.say(f"[tpu-rl] health: could not record the stop in {record}: {err}")
    kept = f"its last committed checkpoint: step {committed}" if committed is not None else "no checkpoint committed"
    health.say(f"[tpu-rl] health: stopped at step {stop.step}: {stop.why} ({kept})")
    _exit_now(jobrunner.STOPPED_EXIT)


def fetch_task_data() -> None:
    """A task's rows kept in a bucket: copied into its folder on the VM, once, before MaxText reads them there."""
    folder = os.environ.get(TASK_ENV)
    if not folder:
        return
    with open(os.path.join(folder, "task.json")) as f:
        fetch = json.load(f).get("fetch") or {}
    for name, url in fetch.items():
        path = os.path.join(folder, name)
        if os.path.exists(path):
            continue
        data = gcs.read(url)
        if data is None:
            raise SystemExit(f"[tpu-rl] the task's data {url} is not in the bucket (jobs/tasks: data)")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(f"{path}.part", "wb") as f:
            f.write(data)
        os.replace(f"{path}.part", path)
        print(f"[tpu-rl] copied the task's {url} ({len(data):,} bytes) to {path}", file=sys.stderr, flush=True)


def _run_identity() -> str | None:
    """The run's identity from its first start's record (attempts.run_identity); None without one."""
    folder = os.environ.get(attempts.DIR_ENV, "").rstrip("/")
    try:
        return attempts.run_identity(attempts.record_names(folder)) if folder else None
    except Exception:  # noqa: BLE001 - a storage error: W&B then logs this start as a run of its own, said
        return None


def _pool_open() -> bool:
    return getattr(sys.modules.get(GRADER_POOL), "_POOL", None) is not None


def _exit_now(code) -> None:
    """After a failure the pool's workers may be gone with tasks queued, and joining them would hang like
    MaxText's own exit: end the process now, with the module's status (its outputs do not count anyway)."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
