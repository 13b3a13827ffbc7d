"""A fab command on a gke stack: the same jobs planned as JobSets, driven through the cluster."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from ..jobs.load import JobFiles
from ..jobs.plan import Plan, PlannedJob, build, check_local
from ..jobs.spec import PipelineSpec
from ..vm.output import Cleaner
from . import jobsets


def target_of(outputs: dict, spec: PipelineSpec) -> jobsets.Slice:
    """The slice from the stack's outputs and the image from jobs/pipeline.yaml."""
    jobsets.require_image(spec)
    spot = outputs.get("provisioning_model") == "SPOT"
    return jobsets.Slice(bucket=outputs["bucket"], topology=outputs["topology"], image=spec.gke.image, spot=spot)


def overrides(files: JobFiles, target: jobsets.Slice, given: list[str]) -> list[str]:
    """The gke settings, then the user's --arg (which win), checked like any job before anything is contacted."""
    merged = [*jobsets.overrides(target), *given]
    check_local(files, merged)
    return merged


def plan(files: JobFiles, merged: list[str], run_name: str, target: jobsets.Slice) -> Plan:
    """The MaxText jobs for `overrides(...)`, each planned as its JobSet (its key is the JobSet's name)."""
    built = build(files, merged, run_name)
    manifests = jobsets.manifests(built.rendered, target, run_name)
    jobs = tuple(
        PlannedJob(
            job.name,
            manifests[job.name]["metadata"]["name"],
            MappingProxyType(manifests[job.name]),
            tuple(need for need in job.needs if need in manifests),
            rendered=job.rendered,
        )
        for job in built.jobs
        if job.name in manifests
    )
    return dataclasses.replace(built, jobs=jobs)


def connect(outputs: dict, cleaner: Cleaner):
    """The stack's cluster through the kubeconfig context `gcloud container clusters get-credentials` writes."""
    from .cluster import Cluster  # the Kubernetes and Cloud Storage clients take a second to import: only here

    return Cluster(
        f"gke_{outputs['project']}_{outputs['zone']}_{outputs['cluster_name']}",
        outputs["project"],
        outputs["bucket"],
        cleaner,
    )
