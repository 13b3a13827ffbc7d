"""The `gke` backend: a multi-host v6e slice the way `xpk cluster create-pathways` builds it.

MaxText 0.2.3 runs multi-host GRPO only through Pathways on GKE, so this declares what
XPK would: a VPC-native cluster with Dataplane V2 and Workload Identity, a TPU node pool
of `ct6e-standard-4t` hosts in one COMPACT placement with the slice's topology, a CPU
pool `cpu-np` for the Pathways head (and convert/export), the results bucket, an identity
for the jobs that may use that bucket only, and JobSet and Kueue from their pinned
releases with XPK's queue objects. Jobs themselves are not declared here: `fab` submits
them as JobSets, or hands them to the pipeline's driver in the cluster, whose service
account may only get, create and delete this namespace's JobSets (DRIVER_RULES).
"""

from __future__ import annotations

import hashlib
import json

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .settings import PROJECT, Settings, label_value
from .storage import BUCKET_ROLES, results_bucket

TPU_MACHINE_TYPE = "ct6e-standard-4t"
GKE_ACCELERATOR = "tpu-v6e-slice"
CPU_POOL = "cpu-np"  # the name XPK's Pathways template selects the head's node by
JOBSET_VERSION = "v0.10.1"  # as XPK pins them (core/cluster.py, core/kueue_manager.py)
KUEUE_VERSION = "v0.17.1"
JOBSET_MANIFESTS = f"https://github.com/kubernetes-sigs/jobset/releases/download/{JOBSET_VERSION}/manifests.yaml"
KUEUE_MANIFESTS = f"https://github.com/kubernetes-sigs/kueue/releases/download/{KUEUE_VERSION}/manifests.yaml"
NAMESPACE = "tpu-rl"
JOBS_SERVICE_ACCOUNT = "tpu-rl-jobs"
DRIVER_SERVICE_ACCOUNT = "tpu-rl-driver"  # the pipeline's driver (bootstrap/remote/gke_driver.py)
USERS = {"jobs": JOBS_SERVICE_ACCOUNT, "driver": DRIVER_SERVICE_ACCOUNT}  # Pulumi name -> Kubernetes service account
# What each user may do on the bucket: the jobs write checkpoints and exports; the driver only reads what they
# wrote (commit markers, inputs' digests), so a driver's bug or stolen token cannot change a result.
BUCKET_ROLES_OF = {"jobs": BUCKET_ROLES, "driver": ("roles/storage.objectViewer",)}
DRIVER_RULES = [{"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["get", "create", "delete"]}]
CLUSTER_QUEUE = "cluster-queue"  # XPK's names
LOCAL_QUEUE = "multislice-queue"
SCOPES = [
    "https://www.googleapis.com/auth/devstorage.full_control",
    "https://www.googleapis.com/auth/cloud-platform",
]


def account_id(cluster_name: str, key: str) -> str:
    """A Google service account's id (6 to 30 characters) for one user of the cluster: the jobs' as it always
    was; another user's ends in a hash of its name, so that a long cluster name cut to 30 never makes two
    users one id."""
    plain = f"{cluster_name}-{key}"
    if key == "jobs" or len(plain) <= 30:
        return plain[:30].rstrip("-")
    return f"{cluster_name[:20].rstrip('-')}-{hashlib.sha256(plain.encode()).hexdigest()[:5]}-{key[:3]}"


def tpu_node_config(settings: Settings) -> gcp.container.NodePoolNodeConfigArgs:
    """The TPU hosts: capacity from the reservation, spot or flex-start, as on the vm backend (a configured
    reservation is used by STANDARD hosts too; flex-start takes none, as XPK's --reservation-affinity=none)."""
    model = settings.provisioning_model
    reservation = None
    if settings.reservation:
        reservation = gcp.container.NodePoolNodeConfigReservationAffinityArgs(
            consume_reservation_type="SPECIFIC_RESERVATION",
            key="compute.googleapis.com/reservation-name",
            values=[settings.reservation],
        )
    elif model == "FLEX_START":
        reservation = gcp.container.NodePoolNodeConfigReservationAffinityArgs(consume_reservation_type="NO_RESERVATION")
    return gcp.container.NodePoolNodeConfigArgs(
        machine_type=TPU_MACHINE_TYPE,
        reservation_affinity=reservation,
        spot=model == "SPOT" or None,
        flex_start=model == "FLEX_START" or None,
        max_run_duration=f"{settings.max_run_duration_s}s" if model == "FLEX_START" else None,
        gvnic=gcp.container.NodePoolNodeConfigGvnicArgs(enabled=True),
        oauth_scopes=SCOPES,
        workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(mode="GKE_METADATA"),
        labels={"app": PROJECT},
    )


def kubeconfig(cluster: gcp.container.Cluster) -> pulumi.Output[str]:
    """A kubeconfig that authenticates with gke-gcloud-auth-plugin (the user's gcloud login)."""

    def render(args: list) -> str:
        name, endpoint, ca = args
        user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "gke-gcloud-auth-plugin"}}
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": name, "cluster": {"server": f"https://{endpoint}", "certificate-authority-data": ca}}
                ],
                "users": [{"name": name, "user": user}],
                "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
                "current-context": name,
            }
        )

    return pulumi.Output.all(cluster.name, cluster.endpoint, cluster.master_auth.cluster_ca_certificate).apply(render)


KUEUE_API = "kueue.x-k8s.io/v1beta2"  # Kueue v0.17.1's storage version (v1beta1 is deprecated there)
CPU_FLAVOR = "cpu-user"  # XPK's flavor for a Pathways cluster's CPU pool (core/kueue_manager.py)
CPU_QUOTA = {"cpu": 480, "memory": "2000G"}  # XPK's nominal quota for it


def kueue_objects(settings: Settings) -> dict[str, dict]:
    """XPK's Kueue objects for a Pathways cluster (templates/kueue_config.yaml.j2, core/kueue_manager.py):
    a flavor for the slice's TPUs, the cpu-user flavor for the Pathways head on cpu-np (Kueue admits a
    workload only if every resource it requests is covered), the ClusterQueue and the LocalQueue."""
    gke = settings.gke
    flavor = f"{gke.nodes}x{GKE_ACCELERATOR}-{gke.topology}"
    labels = {
        "cloud.google.com/gke-tpu-accelerator": GKE_ACCELERATOR,
        "cloud.google.com/gke-tpu-topology": gke.topology,
    }
    tpu_quota = {"name": flavor, "resources": [{"name": "google.com/tpu", "nominalQuota": gke.chips}]}
    cpu_quota = {"name": CPU_FLAVOR, "resources": [{"name": k, "nominalQuota": v} for k, v in CPU_QUOTA.items()]}
    queue = {
        "preemption": {"reclaimWithinCohort": "Never", "withinClusterQueue": "LowerPriority"},
        "namespaceSelector": {},
        "resourceGroups": [
            {"coveredResources": ["google.com/tpu"], "flavors": [tpu_quota]},
            {"coveredResources": list(CPU_QUOTA), "flavors": [cpu_quota]},
        ],
    }
    cpu_labels = {"cloud.google.com/gke-nodepool": CPU_POOL}
    return {  # by Pulumi resource name (the first, third and fourth kept from earlier versions)
        "flavor": {"kind": "ResourceFlavor", "metadata": {"name": flavor}, "spec": {"nodeLabels": labels}},
        "cpu-flavor": {"kind": "ResourceFlavor", "metadata": {"name": CPU_FLAVOR}, "spec": {"nodeLabels": cpu_labels}},
        "cluster-queue": {"kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE}, "spec": queue},
        "local-queue": {
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": NAMESPACE},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    }


def queue_objects(settings: Settings, opts: pulumi.ResourceOptions) -> None:
    for name, manifest in kueue_objects(settings).items():
        k8s.apiextensions.CustomResource(
            name,
            api_version=KUEUE_API,
            kind=manifest["kind"],
            metadata=manifest["metadata"],
            spec=manifest["spec"],
            opts=opts,
        )


class GkeSlice(pulumi.ComponentResource):
    """The cluster, its TPU and CPU pools, the bucket, the jobs' and the driver's identities, JobSet, Kueue and the
    queues."""

    def __init__(self, name: str, settings: Settings, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{PROJECT}:index:GkeSlice", name, None, opts)
        s, gke = settings, settings.gke
        child = pulumi.ResourceOptions(parent=self)
        labels = {"app": PROJECT, "stack": label_value(pulumi.get_stack())}

        self.cluster = gcp.container.Cluster(
            "cluster",
            name=gke.cluster_name,
            location=s.zone,
            network=s.network,
            remove_default_node_pool=True,
            initial_node_count=1,
            ip_allocation_policy=gcp.container.ClusterIpAllocationPolicyArgs(),  # VPC-native (--enable-ip-alias)
            datapath_provider="ADVANCED_DATAPATH",  # Dataplane V2
            workload_identity_config=gcp.container.ClusterWorkloadIdentityConfigArgs(
                workload_pool=f"{s.gcp_project}.svc.id.goog"
            ),
            release_channel=gcp.container.ClusterReleaseChannelArgs(channel="RAPID"),
            # export's follow-up steps write into the bucket through a mounted folder
            addons_config=gcp.container.ClusterAddonsConfigArgs(
                gcs_fuse_csi_driver_config=gcp.container.ClusterAddonsConfigGcsFuseCsiDriverConfigArgs(enabled=True)
            ),
            deletion_protection=False,  # `pulumi destroy` removes it; the bucket keeps the results
            resource_labels=labels,
            opts=child,
        )
        # Flex-start as XPK creates it (xpk/core/capacity.py, nodepool.py): no hosts until a workload asks,
        # then the whole slice (--enable-autoscaling --location-policy=ANY --max-nodes=N --num-nodes=0), and no
        # auto-repair (--no-enable-autorepair), which would recreate hosts that flex-start has released.
        flex = s.provisioning_model == "FLEX_START"
        gcp.container.NodePool(
            "tpu",
            name=f"{gke.cluster_name}-np-0",
            cluster=self.cluster.name,
            location=s.zone,
            node_locations=[s.zone],
            node_count=None if flex else gke.nodes,
            initial_node_count=0 if flex else None,
            autoscaling=gcp.container.NodePoolAutoscalingArgs(
                location_policy="ANY", min_node_count=0, max_node_count=gke.nodes
            )
            if flex
            else None,
            management=gcp.container.NodePoolManagementArgs(auto_repair=False) if flex else None,
            max_pods_per_node=15,
            placement_policy=gcp.container.NodePoolPlacementPolicyArgs(type="COMPACT", tpu_topology=gke.topology),
            node_config=tpu_node_config(s),
            opts=child,
        )
        gcp.container.NodePool(
            "cpu",
            name=CPU_POOL,
            cluster=self.cluster.name,
            location=s.zone,
            initial_node_count=1,
            autoscaling=gcp.container.NodePoolAutoscalingArgs(min_node_count=1, max_node_count=20),
            node_config=gcp.container.NodePoolNodeConfigArgs(
                machine_type=gke.cpu_machine_type,
                oauth_scopes=SCOPES,
                workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(
                    mode="GKE_METADATA"
                ),
                labels={"app": PROJECT},
            ),
            opts=child,
        )

        self.bucket = results_bucket(s, labels, child)
        emails = {key: self._google_account(key, s, child) for key in USERS}

        provider = k8s.Provider("gke", kubeconfig=kubeconfig(self.cluster), opts=child)
        in_cluster = pulumi.ResourceOptions(parent=self, provider=provider)
        jobset = k8s.yaml.v2.ConfigFile("jobset", file=JOBSET_MANIFESTS, opts=in_cluster)
        kueue = k8s.yaml.v2.ConfigFile("kueue", file=KUEUE_MANIFESTS, opts=in_cluster)
        namespace = k8s.core.v1.Namespace("namespace", metadata={"name": NAMESPACE}, opts=in_cluster)
        in_namespace = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[namespace])
        for key, user in USERS.items():
            identity = {"iam.gke.io/gcp-service-account": emails[key]}
            k8s.core.v1.ServiceAccount(
                key, metadata={"name": user, "namespace": NAMESPACE, "annotations": identity}, opts=in_namespace
            )
        driver = {"name": DRIVER_SERVICE_ACCOUNT, "namespace": NAMESPACE}
        k8s.rbac.v1.Role("driver", metadata=driver, rules=DRIVER_RULES, opts=in_namespace)
        k8s.rbac.v1.RoleBinding(
            "driver",
            metadata=driver,
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": DRIVER_SERVICE_ACCOUNT},
            subjects=[{"kind": "ServiceAccount", **driver}],
            opts=in_namespace,
        )
        queue_objects(s, pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[kueue, jobset, namespace]))
        self.register_outputs({"cluster": self.cluster.name, "bucket": self.bucket.name})

    def _google_account(self, key: str, s: Settings, child: pulumi.ResourceOptions) -> pulumi.Output[str]:
        """The Google service account of one Kubernetes user (Workload Identity), with only its roles on the
        bucket; its email, for the Kubernetes account's annotation."""
        account = gcp.serviceaccount.Account(
            key,
            account_id=account_id(s.gke.cluster_name, key),
            display_name=f"{PROJECT} GKE {key}",
            opts=child,
        )
        member = account.email.apply(lambda email: f"serviceAccount:{email}")
        for role in BUCKET_ROLES_OF[key]:
            grant = role.rsplit(".", 1)[1]  # the jobs' grants keep their first names: never replaced under a job
            gcp.storage.BucketIAMMember(
                grant if key == "jobs" else f"{key}-{grant}",
                bucket=self.bucket.name,
                role=role,
                member=member,
                opts=child,
            )
        gcp.serviceaccount.IAMMember(
            f"{key}-workload-identity",
            service_account_id=account.name,
            role="roles/iam.workloadIdentityUser",
            member=f"serviceAccount:{s.gcp_project}.svc.id.goog[{NAMESPACE}/{USERS[key]}]",
            opts=child,
        )
        return account.email
