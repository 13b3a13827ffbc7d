"""The gke backend held to the engine's own rules, not to a template: every JobSet and Kueue object against
the CRDs at the pinned tags (JobSet v0.10.1, Kueue v0.17.1), JobSet's length rules for any valid run name,
distinct JobSets for distinct runs, and Kueue's flavor assignment and quota for the train JobSet."""

from __future__ import annotations

import dataclasses
import re

import pytest

from bootstrap.gke import jobsets
from bootstrap.gke import session as gke_session
from bootstrap.jobs import load
from bootstrap.paths import REPO
from bootstrap.results import publish
from infra import gke, settings
from tests import crdschema

IMAGE = "us-docker.pkg.dev/my-project/tpu-rl/maxtext:0.2.3"
DEFAULT_RUN = "2026-12-01-06-07-41"  # how fab names a run
LONGEST_RUN = "A1._-" * 12 + "Zz9_"  # 64 characters, every kind the run-name rule allows
TOPOLOGIES = ("2x4", "4x4", "16x16")


HUB_REPO = "a-user-name-of-many-chars/" + "m" * 70


def manifests(run_name: str, topology: str = "4x4", hub_repo: str = HUB_REPO, spot: bool = False) -> dict[str, dict]:
    """Every JobSet a run creates: the MaxText jobs', the Hub upload's and the driver's that runs them all."""
    target = jobsets.Slice(bucket="my-results", topology=topology, image=IMAGE, spot=spot)
    plan = gke_session.plan(load.read(REPO / "jobs"), jobsets.overrides(target), run_name, target)
    results = plan.spec.results.model_copy(update={"hub_repo": hub_repo, "hub_private": True})
    gke = plan.spec.gke.model_copy(update={"image": IMAGE})
    plan = dataclasses.replace(plan, spec=plan.spec.model_copy(update={"results": results, "gke": gke}))
    hub = publish.gke_hub_job(plan, {"bucket": "my-results", "topology": topology})
    created = {job.name: dict(job.runner_spec) for job in (*plan.jobs, hub)}
    entries = [{"name": name, "needs": [], "start": True, "manifest": manifest} for name, manifest in created.items()]
    pipeline = {"run": run_name, "digest": "0" * 16, "jobs": entries}
    return {**created, jobsets.DRIVER_JOB: jobsets.driver_jobset(pipeline, target, run_name)}


def queue(topology: str = "4x4") -> dict[str, dict]:
    config = {
        "gcp:project": "my-project",
        "gcp:zone": "us-east5-b",
        "tpu-rl:reservation": "r",
        "tpu-rl:backend": "gke",
        "tpu-rl:gkeTopology": topology,
        "tpu-rl:resultsBucket": "my-results",
        "tpu-rl:sshPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJdpTuWTtIyVcSQ6Zr2Vh4ZkD3tEeSz2bV6RIwdNv0s u@h",
    }
    objects = gke.kueue_objects(settings.read(config))
    return {m["metadata"]["name"]: {**m, "apiVersion": gke.KUEUE_API} for m in objects.values()}


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("run_name", [DEFAULT_RUN, LONGEST_RUN])
def test_every_jobset_passes_the_jobset_crd_schema(run_name, topology):
    for name, manifest in manifests(run_name, topology).items():
        assert crdschema.errors(manifest) == [], name
        assert crdschema.object_meta_errors(manifest["metadata"]) == [], name
        spec = manifest["spec"]  # the CRD's CEL rule at spec
        assert not (spec.get("startupPolicy", {}).get("startupPolicyOrder") == "InOrder" and any(
            "dependsOn" in job for job in spec["replicatedJobs"]
        )), "StartupPolicy and DependsOn APIs are mutually exclusive"  # fmt: skip


def test_on_spot_train_is_recreated_after_a_preemption_and_on_demand_never():
    """A preempted Spot node fails train's pods: JobSet recreates the whole slice up to SPOT_RESTARTS times (MaxText
    resumes from the bucket's last checkpoint). The other jobs are the pipeline's to retry, as on demand."""
    spot, standard = manifests(DEFAULT_RUN, spot=True), manifests(DEFAULT_RUN)
    assert crdschema.errors(spot["train"]) == []
    assert spot["train"]["spec"]["failurePolicy"] == {
        "restartStrategy": "Recreate",
        "maxRestarts": jobsets.SPOT_RESTARTS,
    }
    assert standard["train"]["spec"]["failurePolicy"] == {"restartStrategy": "Recreate"}  # JobSet's default: 0
    alike = ("convert", "export")  # (the driver's JobSet carries the plan, train's manifest in it)
    assert [spot[name] for name in alike] == [standard[name] for name in alike]


def test_the_stacks_provisioning_model_decides_spot():
    spec = load.resolve(load.read(REPO / "jobs")).spec
    spec = spec.model_copy(update={"gke": spec.gke.model_copy(update={"image": IMAGE})})
    outputs = {"bucket": "b", "topology": "4x4"}
    assert gke_session.target_of({**outputs, "provisioning_model": "SPOT"}, spec).spot
    assert not gke_session.target_of({**outputs, "provisioning_model": "RESERVATION_BOUND"}, spec).spot


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_kueue_object_passes_its_crd_schema_at_the_storage_version(topology):
    objects = queue(topology)
    assert {m["apiVersion"] for m in objects.values()} == {"kueue.x-k8s.io/v1beta2"}
    for name, manifest in objects.items():
        assert crdschema.errors(manifest) == [], name
    spec = objects["cluster-queue"]["spec"]
    for group in spec["resourceGroups"]:  # the CRD's CEL rule: each flavor lists exactly the covered resources
        for flavor in group["flavors"]:
            assert [r["name"] for r in flavor["resources"]] == group["coveredResources"]
            assert flavor["name"] in objects
    covered = [r for group in spec["resourceGroups"] for r in group["coveredResources"]]
    assert len(covered) == len(set(covered))  # a resource belongs to one group only


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("run_name", [DEFAULT_RUN, LONGEST_RUN])
def test_the_names_jobset_derives_stay_within_kubernetes_limits(run_name, topology):
    """JobSet v0.10.1: the coordinator label `<js>-<rjob>-<job>-<pod>.<subdomain>` (the subdomain is the
    JobSet's name when network.subdomain is unset) is a label value, 63 characters at most; its webhook
    refuses a JobSet whose longest pod name `<js>-<rjob>-<job>-<pod>-<5 random>` passes 63."""
    for manifest in manifests(run_name, topology).values():
        name = manifest["metadata"]["name"]
        subdomain = manifest["spec"].get("network", {}).get("subdomain", name)
        for rjob in manifest["spec"]["replicatedJobs"]:
            last_job, last_pod = rjob["replicas"] - 1, rjob["template"]["spec"].get("parallelism", 1) - 1
            coordinator = f"{name}-{rjob['name']}-{last_job}-{last_pod}.{subdomain}"
            assert len(coordinator) <= 63 and crdschema.LABEL_VALUE.fullmatch(coordinator), coordinator
            assert len(f"{name}-{rjob['name']}-{last_job}-{last_pod}-abcde") <= 63
        assert len(subdomain) <= 63 and crdschema.DNS_LABEL.fullmatch(subdomain)  # the headless Service's name


def test_distinct_runs_never_share_a_jobset():
    """`Exp_1`, `exp.1` and `EXP-1` (and names that differ only at their end) are different runs."""
    long = "x" * 60
    runs = ["Exp_1", "exp.1", "EXP-1", "exp-1", f"{long}aaaa", f"{long}aaab", DEFAULT_RUN]
    for job in ("convert", "train", "export"):
        names = [jobsets.name_of(job, run) for run in runs]
        assert len(set(names)) == len(runs), names
    assert jobsets.name_of("train", "r1") == jobsets.name_of("train", "r1")  # stable: a second fab attaches
    hubs = {manifests("r1", hub_repo=repo)["publish-hub"]["metadata"]["name"] for repo in ("u/a", "u/b", "v/a")}
    assert len(hubs) == 3  # another hub_repo is another upload, never "done already" for the first one's


def quantity(text) -> float:
    """A Kubernetes quantity as a number (cpu cores or bytes)."""
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text)).groups()
    return float(number) * units.get(unit, 1)


def pod_requests(pod: dict) -> dict[str, float]:
    """What Kueue counts for one pod: each container's requests (its limits where requests are missing),
    summed over the containers and the sidecars (init containers that keep running), at least the largest
    plain init container."""

    def of(container: dict) -> dict[str, float]:
        resources = container.get("resources", {})
        return {k: quantity(v) for k, v in {**resources.get("limits", {}), **resources.get("requests", {})}.items()}

    total: dict[str, float] = {}
    init = pod.get("initContainers", [])
    for container in pod["containers"] + [c for c in init if c.get("restartPolicy") == "Always"]:
        for name, amount in of(container).items():
            total[name] = total.get(name, 0) + amount
    for container in (c for c in init if c.get("restartPolicy") != "Always"):
        for name, amount in of(container).items():
            total[name] = max(total.get(name, 0), amount)
    return total


def admit(jobset: dict, objects: dict[str, dict]) -> dict[tuple[str, str], float]:
    """Kueue's flavor assignment (pkg/scheduler/flavorassigner) for each pod set, then the quota check:
    the usage by (flavor, resource); AssertionError where Kueue would not admit it."""
    spec = objects["cluster-queue"]["spec"]
    usage: dict[tuple[str, str], float] = {}
    for rjob in jobset["spec"]["replicatedJobs"]:
        pods = rjob["replicas"] * rjob["template"]["spec"].get("parallelism", 1)
        pod = rjob["template"]["spec"]["template"]["spec"]
        selector = pod.get("nodeSelector", {})
        for resource, amount in pod_requests(pod).items():
            groups = [g for g in spec["resourceGroups"] if resource in g["coveredResources"]]
            assert groups, f"resource {resource} unavailable in ClusterQueue ({rjob['name']})"
            fitting = [
                f["name"]
                for f in groups[0]["flavors"]
                if all(selector.get(k, v) == v for k, v in objects[f["name"]]["spec"].get("nodeLabels", {}).items())
            ]
            assert fitting, f"no flavor of ClusterQueue fits {rjob['name']}'s node selector for {resource}"
            usage[(fitting[0], resource)] = usage.get((fitting[0], resource), 0) + amount * pods
    quota = {
        (f["name"], r["name"]): quantity(r["nominalQuota"])
        for g in spec["resourceGroups"]
        for f in g["flavors"]
        for r in f["resources"]
    }
    for key, used in usage.items():
        assert used <= quota[key], f"{key} needs {used:g}, quota {quota[key]:g}"
    return usage


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_kueue_admits_the_train_jobset_and_it_fits_the_quota(topology):
    objects = queue(topology)
    train = manifests(DEFAULT_RUN, topology)["train"]
    usage = admit(train, objects)
    chips = jobsets.Slice(bucket="b", topology=topology, image=IMAGE).hosts * 4
    tpu_flavor = next(name for name, m in objects.items() if "tpu" in name)
    assert usage[(tpu_flavor, "google.com/tpu")] == chips  # the whole slice, no more
    assert usage[(gke.CPU_FLAVOR, "cpu")] == 16 + 8 + 24  # the head: resource manager, proxy, trainer


def test_the_simulation_refuses_a_queue_that_covers_only_tpus():
    """What the earlier ClusterQueue did: Kueue stops at the head's cpu ("resource cpu unavailable")."""
    objects = queue()
    objects["cluster-queue"]["spec"]["resourceGroups"] = objects["cluster-queue"]["spec"]["resourceGroups"][:1]
    with pytest.raises(AssertionError, match="resource cpu unavailable in ClusterQueue"):
        admit(manifests(DEFAULT_RUN)["train"], objects)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t["spec"].update(bogus=1), "spec.bogus: unknown field"),
        (lambda t: t["spec"]["replicatedJobs"][0].update(replicas=2**40), "does not fit int32"),
        (lambda t: t["spec"]["replicatedJobs"][0].update(replicas="1"), "is not an integer"),
        (lambda t: head(t)["containers"][0]["resources"]["limits"].update(memory="100 GB"), "does not match"),
        (lambda t: head(t)["containers"].append(dict(head(t)["containers"][0])), "two items share the key ['name']"),
        (lambda t: head(t)["containers"][0].update(imagee="x"), "containers[0].imagee: unknown field"),
    ],
)
def test_the_schema_check_refuses_what_the_api_server_would(change, message):
    """Not vacuous: it reaches into the pod specs, and each of these is refused."""
    train = manifests(DEFAULT_RUN)["train"]
    change(train)
    assert any(message in error for error in crdschema.errors(train)), crdschema.errors(train)


def head(jobset: dict) -> dict:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
