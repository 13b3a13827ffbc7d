"""Entry point for `fab`: every task of bootstrap/tasks at the top level (fab --list)."""

from invoke import Collection

from bootstrap.tasks import host_tasks, jobs_tasks, pipeline_tasks, results_tasks

ns = Collection()
for module in (jobs_tasks, pipeline_tasks, results_tasks, host_tasks):
    for task in Collection.from_module(module).tasks.values():
        ns.add_task(task)
