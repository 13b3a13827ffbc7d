"""The gke backend under Pulumi's mocks, field by field against what XPK creates for the same slice."""

from __future__ import annotations

import re

import pytest

from infra import gke
from tests import xpk

from .program import run_program

GKE = {"tpu-rl:backend": "gke", "tpu-rl:resultsBucket": "my-results"}
POOL = "gcp:container/nodePool:NodePool"


def pools(stack) -> dict[str, dict]:
    return {r.name: r.inputs for r in stack.of_type(POOL)}


@pytest.mark.parametrize(
    ("topology", "device"), [("2x4", "v6e-8"), ("4x4", "v6e-16"), ("4x8", "v6e-32"), ("8x8", "v6e-64")]
)
def test_tpu_pool_is_xpks_slice(topology, device):
    """xpk cluster create-pathways --tpu-type=DEVICE --reservation=R: machine, hosts, COMPACT topology, reservation."""
    reference = xpk.system(device)
    tpu = pools(run_program({**GKE, "tpu-rl:gkeTopology": topology}))["tpu"]
    assert tpu["nodeConfig"]["machineType"] == reference.gce_machine_type
    assert tpu["nodeCount"] == reference.vms_per_slice
    assert tpu["placementPolicy"] == {"type": "COMPACT", "tpuTopology": reference.topology}
    assert tpu["nodeConfig"]["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["my-v6e-reservation"],
    }
    # --max-pods-per-node 15 --enable-gvnic --scopes=storage-full,gke-default,cloud-platform
    assert tpu["maxPodsPerNode"] == 15 and tpu["nodeConfig"]["gvnic"] == {"enabled": True}
    assert "https://www.googleapis.com/auth/cloud-platform" in tpu["nodeConfig"]["oauthScopes"]
    assert tpu["nodeLocations"] == ["us-east5-b"]


def test_spot_and_flex_start_instead_of_a_reservation():
    spot = pools(run_program({**GKE, "tpu-rl:provisioningModel": "SPOT"}, drop=("tpu-rl:reservation",)))["tpu"]
    assert spot["nodeConfig"]["spot"] is True and "reservationAffinity" not in spot["nodeConfig"]
    flex = pools(
        run_program(
            {**GKE, "tpu-rl:provisioningModel": "FLEX_START", "tpu-rl:maxRunDurationSeconds": "14400"},
            drop=("tpu-rl:reservation",),
        )
    )["tpu"]
    assert flex["nodeConfig"]["flexStart"] is True and flex["nodeConfig"]["maxRunDuration"] == "14400s"


def test_flex_start_pool_is_xpks():
    """xpk cluster create-pathways --flex: --flex-start --enable-autoscaling --location-policy=ANY
    --reservation-affinity=none --no-enable-autorepair --max-nodes=<hosts> --num-nodes=0 (xpk/core/capacity.py)."""
    config = {**GKE, "tpu-rl:provisioningModel": "FLEX_START", "tpu-rl:maxRunDurationSeconds": "14400"}
    flex = pools(run_program(config, drop=("tpu-rl:reservation",)))["tpu"]
    hosts = xpk.system("v6e-16").vms_per_slice  # the default topology, 4x4
    assert flex["autoscaling"] == {"locationPolicy": "ANY", "minNodeCount": 0, "maxNodeCount": hosts}
    assert flex["initialNodeCount"] == 0 and "nodeCount" not in flex
    assert flex["management"] == {"autoRepair": False}
    assert flex["nodeConfig"]["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}


def test_a_standard_pool_uses_the_configured_reservation_as_the_vm_backend_does():
    standard = pools(run_program({**GKE, "tpu-rl:provisioningModel": "STANDARD"}))["tpu"]
    assert standard["nodeConfig"]["reservationAffinity"]["values"] == ["my-v6e-reservation"]
    assert (
        standard["nodeCount"] == xpk.system("v6e-16").vms_per_slice
        and "autoscaling" not in standard
        and "management" not in standard
    )
    bare = pools(run_program({**GKE, "tpu-rl:provisioningModel": "STANDARD"}, drop=("tpu-rl:reservation",)))["tpu"]
    assert "reservationAffinity" not in bare["nodeConfig"]


def test_cluster_cpu_pool_and_identity_as_xpk_sets_them_up():
    stack = run_program(GKE)
    cluster = stack.one("gcp:container/cluster:Cluster")
    assert cluster["datapathProvider"] == "ADVANCED_DATAPATH"  # --enable-dataplane-v2
    assert "ipAllocationPolicy" in cluster  # --enable-ip-alias
    assert cluster["workloadIdentityConfig"] == {"workloadPool": "my-project.svc.id.goog"}
    assert cluster["addonsConfig"] == {"gcsFuseCsiDriverConfig": {"enabled": True}}  # XPK's optional GCS FUSE
    cpu = pools(stack)["cpu"]
    assert cpu["name"] == "cpu-np"  # the pool XPK's Pathways head is scheduled on
    assert cpu["nodeConfig"]["machineType"] == "n2-standard-64"  # --pathways-gce-machine-type default
    assert cpu["autoscaling"] == {"minNodeCount": 1, "maxNodeCount": 20}
    emails = {r.inputs["accountId"]: f"{r.inputs['accountId']}@my-project.iam.gserviceaccount.com"
              for r in stack.of_type("gcp:serviceaccount/account:Account")}  # fmt: skip
    assert set(emails) == {"tpu-rl-jobs", "tpu-rl-driver"}  # one Google identity per Kubernetes user
    grants = {
        (r.inputs["member"], r.inputs["role"]) for r in stack.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    }
    assert grants == {
        (f"serviceAccount:{emails['tpu-rl-jobs']}", "roles/storage.objectAdmin"),
        (f"serviceAccount:{emails['tpu-rl-jobs']}", "roles/storage.legacyBucketReader"),
        (f"serviceAccount:{emails['tpu-rl-driver']}", "roles/storage.objectViewer"),  # the driver only reads
    }
    bindings = {
        r.inputs["member"]: r.inputs["serviceAccountId"]
        for r in stack.of_type("gcp:serviceaccount/iAMMember:IAMMember")
    }
    assert bindings == {
        f"serviceAccount:my-project.svc.id.goog[tpu-rl/{user}]": f"projects/my-project/serviceAccounts/{emails[user]}"
        for user in ("tpu-rl-jobs", "tpu-rl-driver")
    }  # each Kubernetes user may act as its own Google account only
    annotations = {r.inputs["metadata"]["name"]: r.inputs["metadata"]["annotations"]["iam.gke.io/gcp-service-account"]
                   for r in stack.of_type("kubernetes:core/v1:ServiceAccount")}  # fmt: skip
    assert annotations == {"tpu-rl-jobs": emails["tpu-rl-jobs"], "tpu-rl-driver": emails["tpu-rl-driver"]}
    assert not stack.of_type("gcp:compute/instance:Instance")  # no SSH VM on this backend


def test_jobset_kueue_and_xpks_queue_objects():
    stack = run_program(GKE)
    files = {r.inputs["file"] for r in stack.of_type("kubernetes:yaml/v2:ConfigFile")}
    assert files == {
        "https://github.com/kubernetes-sigs/jobset/releases/download/v0.10.1/manifests.yaml",
        "https://github.com/kubernetes-sigs/kueue/releases/download/v0.17.1/manifests.yaml",
    }
    kueue = [r for r in stack.resources if r.type.startswith("kubernetes:kueue.x-k8s.io")]
    assert {r.type.split(":")[1] for r in kueue} == {"kueue.x-k8s.io/v1beta2"}  # v0.17.1's storage version
    custom = {r.inputs["metadata"]["name"]: r.inputs for r in kueue}
    assert custom["4xtpu-v6e-slice-4x4"]["spec"]["nodeLabels"] == {
        "cloud.google.com/gke-tpu-accelerator": xpk.system("v6e-16").gke_accelerator,
        "cloud.google.com/gke-tpu-topology": "4x4",
    }
    # XPK's Pathways flavor for the head on cpu-np, with its quota (core/kueue_manager.py)
    source = (xpk.install() / "core" / "kueue_manager.py").read_text()
    assert '"nodeLabels": {"cloud.google.com/gke-nodepool": "cpu-np"}' in source
    assert '{"name": "cpu", "nominalQuota": 480}' in source and '{"name": "memory", "nominalQuota": "2000G"}' in source
    assert custom["cpu-user"]["spec"]["nodeLabels"] == {"cloud.google.com/gke-nodepool": "cpu-np"}
    groups = custom["cluster-queue"]["spec"]["resourceGroups"]
    assert groups == [
        {"coveredResources": ["google.com/tpu"], "flavors": [{"name": "4xtpu-v6e-slice-4x4", "resources": [
            {"name": "google.com/tpu", "nominalQuota": 16}]}]},
        {"coveredResources": ["cpu", "memory"], "flavors": [{"name": "cpu-user", "resources": [
            {"name": "cpu", "nominalQuota": 480}, {"name": "memory", "nominalQuota": "2000G"}]}]},
    ]  # fmt: skip
    assert custom["multislice-queue"]["spec"] == {"clusterQueue": "cluster-queue"}


def test_outputs_fab_reads():
    outputs = run_program(GKE).outputs
    assert outputs["backend"] == "gke" and outputs["topology"] == "4x4"
    assert outputs["namespace"] == "tpu-rl" and outputs["queue"] == "multislice-queue"
    assert outputs["bucket"] == "my-results" and "hosts" not in outputs


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"tpu-rl:gkeTopology": "3x3"}, "tpu-rl:gkeTopology: '3x3' is not a multi-host v6e topology"),
        ({"tpu-rl:gkeTopology": "2x2"}, "tpu-rl:gkeTopology: '2x2' is not a multi-host v6e topology"),
        ({"tpu-rl:resultsBucket": ""}, "tpu-rl:resultsBucket: missing; on gke"),
        ({"tpu-rl:backend": "k8s"}, "tpu-rl:backend: unknown backend 'k8s'"),
        ({"tpu-rl:gkeClusterName": "My_Cluster"}, "tpu-rl:gkeClusterName: 'My_Cluster' is not a valid name"),
    ],
)
def test_gke_config_errors(config, message):
    with pytest.raises(Exception) as raised:
        run_program({**GKE, **config})
    assert type(raised.value).__name__ == "ConfigError" and message in str(raised.value)


def test_the_pipelines_driver_may_manage_this_namespaces_jobsets_and_nothing_else():
    """The in-cluster driver's service account, bound to a Role of this namespace that grants only what
    gke_driver.py calls: get, create and delete JobSets (no Secrets, no pods, nothing cluster-wide)."""
    stack = run_program(GKE)
    assert not stack.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
    assert not stack.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
    (role,) = stack.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
    assert role.inputs["metadata"] == {"name": "tpu-rl-driver", "namespace": "tpu-rl"}
    assert role.inputs["rules"] == [
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["get", "create", "delete"]}
    ]
    (binding,) = stack.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
    assert binding.inputs["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "tpu-rl-driver",
    }
    assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": "tpu-rl-driver", "namespace": "tpu-rl"}]
    accounts = {
        r.inputs["metadata"]["name"]: r.inputs["metadata"] for r in stack.of_type("kubernetes:core/v1:ServiceAccount")
    }
    assert set(accounts) == {"tpu-rl-jobs", "tpu-rl-driver"}
    assert all("iam.gke.io/gcp-service-account" in meta["annotations"] for meta in accounts.values())


@pytest.mark.parametrize("length", [1, 6, 28, 29, 35, 40])
def test_each_user_of_any_cluster_name_gets_its_own_valid_account_id(length):
    """Review: past 28 characters, the jobs' and the driver's ids cut to 30 were one id; the jobs' id stays as
    it was on existing stacks."""
    name = "c" * length
    jobs, driver = gke.account_id(name, "jobs"), gke.account_id(name, "driver")
    assert jobs != driver and all(re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", i) for i in (jobs, driver))
    assert jobs == f"{name}-jobs"[:30].rstrip("-")
