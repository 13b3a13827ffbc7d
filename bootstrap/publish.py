"""Keep the exported model: the VM's /dev/shm is lost on restart, and the VM on maintenance."""

from __future__ import annotations

from .pipeline_run import Session


def publish_after_train(session: Session) -> None:
    results = session.spec.results
    if not results.hub_repo and not results.gcs:
        export_dir = session.run.jobs.get("export", {}).get("outputs") or ["the export directory"]
        session.console.print(
            "[bold yellow]The trained model lives only in the VM's memory[/] "
            f"({export_dir[0].rsplit('/', 1)[0]}) and is lost when the VM restarts or is deleted.\n"
            "Keep it: set results.hub_repo (Hugging Face Hub) or results.gcs in jobs/pipeline.yaml and run "
            "fab train again, or copy it here with fab download."
        )
