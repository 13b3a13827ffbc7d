"""Entry point for `fab`: every task of bootstrap/tasks at the top level (fab --list)."""

import atexit
import gc
import sys

# invoke turns bytecode writing off (its --write-pyc): tpu-rl's modules would be compiled again on every command
sys.dont_write_bytecode = False

from invoke import Collection  # noqa: E402

from bootstrap.tasks import host_tasks, jobs_tasks, pipeline_tasks, results_tasks  # noqa: E402

ns = Collection()
for module in (jobs_tasks, pipeline_tasks, results_tasks, host_tasks):
    for task in Collection.from_module(module).tasks.values():
        ns.add_task(task)

# What is imported lives until exit: garbage collections skip it, and the one at exit skips everything (0.05 s)
gc.freeze()
atexit.register(gc.freeze)
