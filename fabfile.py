"""Entry point for `fab`: every task of bootstrap/tasks at the top level (fab --list)."""

import atexit
import gc
import os
import sys

# invoke turns bytecode writing off (its --write-pyc): tpu-rl's modules would be compiled again on every command
sys.dont_write_bytecode = False
gc.disable()  # the imports below live until exit: collecting among them finds nothing (4 ms; a session's: common.py)
# fab's schemas use no pydantic plugin, and looking for one read every installed package's metadata (11 ms,
# 2026-12-07). What fab starts here inherits it (pulumi, tensorboard, fab check's validator); jobs and the VM do not.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from invoke import Collection  # noqa: E402

from bootstrap.tasks import common, demo_tasks, host_tasks, jobs_tasks, pipeline_tasks, results_tasks, suggest  # noqa: E402

suggest.install()  # `fab trian`: the task meant, not invoke's bare "No idea what 'trian' is!"
common.quiet_broken_pipe()  # `fab --help | head`: no traceback

ns = Collection()
for module in (jobs_tasks, pipeline_tasks, results_tasks, host_tasks, demo_tasks):
    for task in Collection.from_module(module).tasks.values():
        ns.add_task(task)

# What is imported lives until exit: later collections skip it, and the one at exit skips everything (0.05 s)
gc.freeze()
gc.enable()
atexit.register(gc.freeze)
