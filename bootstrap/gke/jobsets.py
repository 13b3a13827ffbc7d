"""The jobs as JobSets for the gke backend: train as XPK's Pathways JobSet, convert and export on CPU.

The same jobs/ are resolved with `overrides` (every path on the stack's bucket, the
image's python, the Pathways settings MaxText's multi-host RL needs), so they pass the
same local checks as on the VM. `train` becomes the JobSet `xpk workload
create-pathways` renders (templates/pathways_workload_create.yaml.j2): a `pathways-head`
job on the CPU pool with the proxy and resource manager beside the MaxText container,
and a `worker` job with one Pathways worker per TPU host. The token reaches every
container from the Kubernetes Secret `SECRET`, never from the manifest or an argv.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass

from infra import topology

from ..errors import UserError
from ..jobs.load import RenderedJob
from ..remote import manifest
from ..remote.gke_driver import PIPELINE_FAILED
from ..remote.jobset_state import INPUTS_ANNOTATION, OUTPUTS_ANNOTATION

SECRET = "tpu-rl-hf-token"
TOOLS_CONFIG_MAP = "tpu-rl-tools"
# train's launcher, export's follow-up steps and the Hub upload, mounted from TOOLS_CONFIG_MAP
# and the pipeline's driver in the cluster (gke_driver.py, with the modules it runs on)
TOOLS = ("maxtext_run.py", "attempts.py", "eval_recorder.py", "wandb_run.py", "export_config.py", "manifest.py",
         "hub_upload.py", "evals.py", "gke_driver.py", "graph.py", "jobrunner.py", "processes.py", "folders.py",
         "jobset_state.py", "gcs.py", "retry.py", "faults.py", "health.py", "health_hooks.py", "eval_sample.py",
         "grader_worker.py")  # fmt: skip
TOOLS_DIR = "/tpu-rl/tools"
SPOT_RESTARTS = 10  # preemptions one train on Spot rides out before its JobSet fails
BUCKET_MOUNT = "/gcs"  # the bucket through GKE's Cloud Storage FUSE driver, for steps that need a folder
PUBLISHED = f"{BUCKET_MOUNT}/published"  # the Hub uploads' markers: <run>/hub-<owner>--<name>.json
RUN_ANNOTATION = "tpu-rl/run"  # the run's own name (the JobSet's name holds only part of it)
CPU_POOL = "cpu-np"
NAMESPACE = "tpu-rl"
QUEUE = "multislice-queue"
SERVICE_ACCOUNT = "tpu-rl-jobs"
DRIVER_SERVICE_ACCOUNT = "tpu-rl-driver"  # may get, create and delete this namespace's JobSets (infra/gke.py)
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where the kubelet puts its token
PLAN_DIGEST_ANNOTATION = "tpu-rl/plan-digest"  # the driver's plan: the same command again attaches to it
PROXY_IMAGE = "us-docker.pkg.dev/cloud-tpu-v2-images/pathways/proxy_server:latest"
SERVER_IMAGE = "us-docker.pkg.dev/cloud-tpu-v2-images/pathways/server:latest"
PATHWAYS_VERSION = "tpuv6e"
# Describe the single VM of the vm backend; on GKE the slice's TPU environment comes from GKE and Pathways.
VM_ONLY_ENV = re.compile(r"TPU_[A-Z_]+")
COORDINATOR = "metadata.labels['jobset.sigs.k8s.io/coordinator']"


@dataclass(frozen=True)
class Slice:
    """Where the jobs run: the stack's cluster objects and the slice's topology."""

    bucket: str
    topology: str
    image: str
    spot: bool = False  # the TPU node pool is Spot (tpu-rl:provisioningModel SPOT): train rides out preemptions

    @property
    def hosts(self) -> int:
        return topology.hosts(self.topology)


def require_image(spec) -> None:
    """The gke backend runs the jobs in an image the user built: refuse before anything is contacted."""
    if not spec.gke.image:
        raise UserError(
            "jobs/pipeline.yaml: gke.image: missing; the gke backend runs the jobs in a MaxText post-training image "
            "(MaxText's build_maxtext_docker_image WORKFLOW=post-training, then push it to Artifact Registry)"
        )


def overrides(target: Slice) -> list[str]:
    """--arg values that put the pipeline on GKE: paths on GCS, the image's python, Pathways for train."""
    return [
        f"vars.work_dir=gs://{target.bucket}/${{model_name}}",
        # export's follow-up steps (generation config, SHA256SUMS) work on a folder: the bucket's, mounted
        f"vars.export_dir={BUCKET_MOUNT}/${{model_name}}/hf-trained/${{run_name}}",
        "vars.hf_home=/tmp/huggingface",
        "train.chips_per_vm=4",  # ct6e-standard-4t hosts; MaxText splits trainer and sampler across them
        "train.checkpoint_storage_use_ocdbt=False",  # Pathways writes checkpoints without these
        "train.checkpoint_storage_use_zarr3=False",
        "train.env.ENABLE_PATHWAYS_PERSISTENCE=1",
    ]


def _env(job: RenderedJob, extra: list[dict]) -> list[dict]:
    env = [{"name": k, "value": _literal(v)} for k, v in job.env.items() if not VM_ONLY_ENV.fullmatch(k)]
    return env + _secret_env(job.secrets) + extra


def _secret_env(names: list[str]) -> list[dict]:
    return [{"name": s, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": s}}} for s in names]


def _field(name: str, path: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


# JobSet v0.10.1 labels every child Job and pod `jobset.sigs.k8s.io/coordinator:
# <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>` (pkg/controllers/jobset_controller.go), and with
# network.subdomain unset the subdomain is the JobSet's own name: a label value holds 63 characters at most.
LABEL_MAX = 63
NAME_MAX = (LABEL_MAX - len("-pathways-head-0-0.")) // 2  # 22


def name_of(job: str, run_name: str) -> str:
    """The JobSet of this job and run: a DNS-1123 label of at most NAME_MAX characters, unique to both (a
    hash of the exact job and run names), so that no two runs share one and every name JobSet derives
    from it (coordinator label, headless Service, pod names) stays within Kubernetes' limits."""
    digest = hashlib.sha256(f"{job}\0{run_name}".encode()).hexdigest()[:6]
    readable = re.sub(r"[^a-z0-9]+", "-", f"{job[:6]}-{run_name}".lower())
    return f"{readable[: NAME_MAX - len(digest) - 1].strip('-')}-{digest}"


def in_bucket(path: str, bucket: str) -> str:
    """A path under the bucket's mount as Cloud Storage names it."""
    return f"gs://{bucket}{path.removeprefix(BUCKET_MOUNT)}" if path.startswith(BUCKET_MOUNT + "/") else path


def _tool(path: str) -> str:
    """A tpu-rl tool the job names by its VM path, where the pods mount it (only TOOLS are there)."""
    name = path.rsplit("/", 1)[-1]
    if name not in TOOLS:
        raise UserError(f"{path}: the gke backend mounts only tpu-rl's own tools ({', '.join(TOOLS)}) in its pods")
    return f"{TOOLS_DIR}/{name}"


def command(job: RenderedJob) -> list[str]:
    """The module with the image's python3 (through its launcher, if it has one), then its follow-up
    steps, with the tools from the ConfigMap; `$` escaped, so that the pod runs the words the VM would."""
    if job.module:
        runs = job.argv[1] if job.argv[1] == "-m" else _tool(job.argv[1])
        main = ["python3", runs, *job.argv[2:]]
    else:
        main = list(job.argv)
    if not job.after:
        return [_literal(word) for word in main]
    steps = [main, *(["python3", _tool(step[1]), *step[2:]] for step in job.after)]
    return ["sh", "-c", _literal(" && ".join(shlex.join(step) for step in steps))]


def _main_container(job: RenderedJob, target: Slice, extra_env: list[dict]) -> dict:
    return {
        "name": "jax-tpu" if extra_env else "main",
        "image": target.image,
        "imagePullPolicy": "Always",
        "command": command(job),
        "env": _env(job, extra_env),
    }


def _metadata(name: str, outputs: list[str], target: Slice, run_name: str, labels: dict, identity: str = "") -> dict:
    """A JobSet named for its job and run (and `identity`, what else makes it another job)."""
    return {
        "name": name_of(name + identity, run_name),
        "namespace": NAMESPACE,
        "labels": {**labels, "tpu-rl/job": name[:LABEL_MAX]},
        "annotations": {
            OUTPUTS_ANNOTATION: " ".join(in_bucket(path, target.bucket) for path in outputs),
            RUN_ANNOTATION: run_name,
        },
    }


def cpu_jobset(job: RenderedJob, target: Slice, run_name: str) -> dict:
    """convert and export: one pod on the CPU pool (they need memory, not TPUs)."""
    container = {**_main_container(job, target, []), "resources": _cpu_resources(job)}
    return _one_pod_jobset(_metadata(job.name, job.outputs, target, run_name, {}), container, target)


def _one_pod_jobset(metadata: dict, container: dict, target: Slice, bucket: bool = True) -> dict:
    """One pod on the CPU pool, tpu-rl's tools (and the bucket) mounted, not restarted (the pipeline retries;
    the driver's own Job says otherwise)."""
    mounts, volumes = (CPU_MOUNTS, _cpu_volumes(target)) if bucket else ([TOOLS_MOUNT], [TOOLS_VOLUME])
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": [
                {
                    "name": "main",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "backoffLimit": 0,
                            "completions": 1,
                            "parallelism": 1,
                            "template": {
                                "metadata": {"annotations": {"gke-gcsfuse/volumes": "true"}} if bucket else {},
                                "spec": {
                                    "serviceAccountName": SERVICE_ACCOUNT,
                                    "nodeSelector": {"cloud.google.com/gke-nodepool": CPU_POOL},
                                    "containers": [{**container, "volumeMounts": mounts}],
                                    "restartPolicy": "Never",
                                    "volumes": volumes,
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


HUB_UPLOAD_RESOURCES = {"cpu": "4", "memory": "8Gi"}  # hub_upload.py streams files; it holds none whole
CARD_DIR = "/tmp/tpu-rl-card"  # the pod's own: hub_upload.py writes the filled-in card beside the template


def hub_jobset(name: str, folder: str, repo: str, flags: list[str], env: dict[str, str], card: str,
               target: Slice, run_name: str) -> dict:  # fmt: skip
    """The Hub upload after export, in the cluster (so it runs without this machine): hub_upload.py reads the
    export through the bucket's mount, gets the card template in its environment and the token from SECRET,
    and leaves its marker under PUBLISHED. Named for the repository too (another hub_repo is another upload);
    stale when the export's SHA256SUMS changes (an export made again is uploaded again)."""
    if not folder.startswith(BUCKET_MOUNT + "/"):
        raise UserError(f"vars.export_dir={folder}: on gke the export must be in the bucket ({BUCKET_MOUNT}/...)")
    marker = f"{PUBLISHED}/{run_name}/hub-{repo.replace('/', '--')}.json"
    card_file = f"{CARD_DIR}/card.md"
    upload = ["python3", f"{TOOLS_DIR}/hub_upload.py", folder, repo, *flags, "--card", card_file, "--marker", marker]
    script = f'mkdir -p {CARD_DIR} && printf %s "$TPU_RL_CARD" > {card_file} && {shlex.join(upload)}'
    env = {**env, "TPU_RL_CARD": card}
    container = {
        "name": "main",
        "image": target.image,
        "imagePullPolicy": "Always",
        "command": ["sh", "-c", _literal(script)],
        "env": [{"name": k, "value": _literal(v)} for k, v in env.items()] + _secret_env(["HF_TOKEN"]),
        "resources": {"requests": HUB_UPLOAD_RESOURCES, "limits": dict(HUB_UPLOAD_RESOURCES)},
    }
    metadata = _metadata(name, [marker], target, run_name, {}, identity=repo)
    metadata["annotations"][INPUTS_ANNOTATION] = in_bucket(f"{folder}/{manifest.NAME}", target.bucket)
    return _one_pod_jobset(metadata, container, target)


DRIVER_JOB = "pipeline"
DRIVER_RESOURCES = {"cpu": "500m", "memory": "512Mi"}  # it polls a few JobSets and lists a few objects
DRIVER_IDENTITY = "/driver"  # no job's name has a "/": never a job's JobSet
DRIVER_RESTARTS = 3  # a driver that crashed (the API away too long) is started again: a new pass adopts what runs
PLAN_ENV = "TPU_RL_PLAN"
# Linux's MAX_ARG_STRLEN: one environment string ("NAME=value" and its NUL) at most 128 KiB, or the pod's
# container does not even start (E2BIG), after the JobSet was admitted.
MAX_ENV_STRING = 128 * 1024


def driver_name(run_name: str) -> str:
    return name_of(DRIVER_JOB + DRIVER_IDENTITY, run_name)


def driver_jobset(plan: dict, target: Slice, run_name: str) -> dict:
    """The pipeline's driver in the cluster (gke_driver.py): the plan fab checked, as data in its environment,
    under the service account that may manage this namespace's JobSets. Its pod is started again after a
    crash or a node's disruption (a new pass adopts what runs), never after the pipeline failed (exit
    PIPELINE_FAILED: the next fab train retries, as on the VM)."""
    container = {
        "name": "main",
        "image": target.image,  # for its python3: the driver's code is in the ConfigMap
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", f"{TOOLS_DIR}/gke_driver.py", SERVICE_ACCOUNT_DIR, NAMESPACE],
        "env": [{"name": PLAN_ENV, "value": _plan_value(plan)}],
        "resources": {"requests": DRIVER_RESOURCES, "limits": dict(DRIVER_RESOURCES)},
    }
    metadata = _metadata(DRIVER_JOB, [], target, run_name, {}, identity=DRIVER_IDENTITY)
    metadata["annotations"][PLAN_DIGEST_ANNOTATION] = plan["digest"]
    jobset = _one_pod_jobset(metadata, container, target, bucket=False)  # it reads the bucket's API, not a mount
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    job["backoffLimit"] = DRIVER_RESTARTS
    job["podFailurePolicy"] = {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "main", "operator": "In", "values": [PIPELINE_FAILED]},
            },
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }
    job["template"]["spec"]["serviceAccountName"] = DRIVER_SERVICE_ACCOUNT
    return jobset


def _plan_value(plan: dict) -> str:
    """The plan as the driver's environment value; a plan too large for one is refused before anything is made."""
    value = _literal(json.dumps(plan, sort_keys=True))
    size = len(f"{PLAN_ENV}={value}".encode()) + 1
    if size > MAX_ENV_STRING:
        raise UserError(
            f"the pipeline's plan is {size / 1024:.0f} KiB, beyond the {MAX_ENV_STRING // 1024} KiB Linux allows one "
            f"environment value ({PLAN_ENV} of the driver's pod); nothing was created: shorten the jobs' long values "
            "(--arg, jobs/*.yaml) or run fewer jobs at once (fab convert, then fab train)"
        )
    return value


def _literal(text: str) -> str:
    """`text` such that Kubernetes passes it on as it is: it expands $(NAME) in commands and env values (a
    `$(HF_TOKEN)` would put the token on a command line), and $$ to $. Every command and env value."""
    return text.replace("$", "$$")


# Requests equal to limits (Guaranteed: not the first pod evicted under memory pressure), sized for the
# 8B model on cpu-np's n2-standard-64 (256 GB). to_maxtext with lazy_load_tensors=False holds the whole
# Hugging Face checkpoint (16 GB of bf16) and the converted float32 parameters (8B x 4 bytes = 32 GB), with
# host copies while sharding; to_huggingface holds the bf16 training checkpoint (16 GB) and its bf16 export.
CPU_JOB_MEMORY = {
    "maxtext.checkpoint_conversion.to_maxtext": "128Gi",
    "maxtext.checkpoint_conversion.to_huggingface": "64Gi",
}
CPU_JOB_CPUS = "16"


def _cpu_resources(job: RenderedJob) -> dict:
    amounts = {"cpu": CPU_JOB_CPUS, "memory": CPU_JOB_MEMORY.get(job.module, "64Gi")}
    return {"requests": amounts, "limits": dict(amounts)}


TOOLS_MOUNT = {"name": "tools", "mountPath": TOOLS_DIR}
TOOLS_VOLUME = {"name": "tools", "configMap": {"name": TOOLS_CONFIG_MAP}}
CPU_MOUNTS = [{"name": "bucket", "mountPath": BUCKET_MOUNT}, TOOLS_MOUNT]


def _cpu_volumes(target: Slice) -> list[dict]:
    fuse = {"driver": "gcsfuse.csi.storage.gke.io", "volumeAttributes": {"bucketName": target.bucket}}
    return [{"name": "bucket", "csi": fuse}, TOOLS_VOLUME]


def _head(job: RenderedJob, target: Slice, scratch: str) -> dict:
    """XPK's pathways-head job: proxy and resource manager as sidecars, the MaxText trainer as the container."""
    proxy = {
        "name": "pathways-proxy",
        "image": PROXY_IMAGE,
        "imagePullPolicy": "Always",
        "args": [
            "--server_port=29000",
            "--resource_manager_address=$(PATHWAYS_HEAD):29001",
            f"--gcs_scratch_location={scratch}",
        ],
        "env": [_field("PATHWAYS_HEAD", COORDINATOR)],
        "ports": [{"containerPort": 29000, "protocol": "TCP"}],
        "resources": {"limits": {"cpu": "16", "memory": "100G"}},
        "restartPolicy": "Always",
    }
    manager = {
        "name": "pathways-rm",
        "image": SERVER_IMAGE,
        "imagePullPolicy": "Always",
        "args": [
            "--server_port=29001",
            f"--gcs_scratch_location={scratch}",
            "--node_type=resource_manager",
            "--instance_count=1",
            f"--instance_type={PATHWAYS_VERSION}:{target.topology}",
        ],
        "env": [
            _field("REPLICATED_JOB_NAME", "metadata.annotations['jobset.sigs.k8s.io/replicatedjob-name']"),
            _field("JOBSET_NAME", "metadata.annotations['jobset.sigs.k8s.io/jobset-name']"),
            _field("HOST_ADDRESS", COORDINATOR),
            {"name": "TPU_SKIP_MDS_QUERY", "value": "true"},
        ],
        "ports": [{"containerPort": 29001, "protocol": "TCP"}, {"containerPort": 29002, "protocol": "TCP"}],
        "resources": {"limits": {"cpu": "8", "memory": "32G"}},
        "restartPolicy": "Always",
    }
    pathways_env = [
        _field("PATHWAYS_HEAD", COORDINATOR),
        {"name": "JAX_PLATFORMS", "value": "proxy"},
        {"name": "XCLOUD_ENVIRONMENT", "value": "GCP"},
        {"name": "JAX_BACKEND_TARGET", "value": "grpc://$(PATHWAYS_HEAD):29000"},
    ]
    trainer = {
        **_main_container(job, target, pathways_env),
        # xpk workload create-pathways: core/docker_resources.py (24 CPUs, 100G) and docker_container.py
        "resources": {"limits": {"cpu": "24", "memory": "100G"}},
        "securityContext": {"privileged": True},
        "volumeMounts": [{"mountPath": "/tmp", "name": "shared-tmp"}, TOOLS_MOUNT],
    }
    return {
        "name": "pathways-head",
        "replicas": 1,
        "template": {
            "metadata": {"annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "kubernetes.io/hostname"}},
            "spec": {
                "backoffLimit": 0,
                "completionMode": "Indexed",
                "completions": 1,
                "parallelism": 1,
                "template": {
                    "spec": {
                        "hostNetwork": True,
                        "dnsPolicy": "ClusterFirstWithHostNet",
                        "serviceAccountName": SERVICE_ACCOUNT,
                        "nodeSelector": {"cloud.google.com/gke-nodepool": CPU_POOL},
                        "initContainers": [proxy, manager],
                        "containers": [trainer],
                        "restartPolicy": "Never",
                        "volumes": [_shared_tmp(), TOOLS_VOLUME],
                    }
                },
            },
        },
    }


def _shared_tmp() -> dict:
    return {"hostPath": {"path": "/tmp", "type": "DirectoryOrCreate"}, "name": "shared-tmp"}


def _workers(name: str, target: Slice, scratch: str) -> dict:
    """XPK's worker job: one Pathways worker per TPU host of the slice."""
    meta = "metadata.annotations['jobset.sigs.k8s.io/{}']"
    env = [
        {"name": "TPU_MIN_LOG_LEVEL", "value": "0"},
        {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "0"},
        {"name": "XCLOUD_ENVIRONMENT", "value": "GCP"},
        {"name": "MEGASCALE_GRPC_ENABLE_XOR_TRACER", "value": "false"},
        _field("MEGASCALE_NUM_SLICES", "metadata.labels['jobset.sigs.k8s.io/replicatedjob-replicas']"),
        _field("JOBSET_NAME", meta.format("jobset-name")),
        _field("REPLICATED_JOB_NAME", meta.format("replicatedjob-name")),
        _field("MEGASCALE_SLICE_ID", "metadata.labels['jobset.sigs.k8s.io/job-index']"),
        _field("PATHWAYS_HEAD", COORDINATOR),
        _field("MEGASCALE_COORDINATOR_ADDRESS", COORDINATOR),
    ]
    worker = {
        "name": "pathways-worker",
        "image": SERVER_IMAGE,
        "imagePullPolicy": "Always",
        "args": [
            "--server_port=29005",
            "--resource_manager_address=$(PATHWAYS_HEAD):29001",
            f"--gcs_scratch_location={scratch}",
        ],
        "env": env,
        "ports": [{"containerPort": port, "protocol": "TCP"} for port in (29005, 29006, 8471, 8080)],
        "resources": {"limits": {"google.com/tpu": str(topology.CHIPS_PER_HOST)}},
        "volumeMounts": [{"mountPath": "/tmp", "name": "shared-tmp"}],
    }
    return {
        "name": "worker",
        "replicas": 1,
        "template": {
            "metadata": {
                "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}
            },
            "spec": {
                "backoffLimit": target.hosts * 4,
                "completionMode": "Indexed",
                "completions": target.hosts,
                "parallelism": target.hosts,
                "template": {
                    "metadata": {"labels": {"xpk.google.com/workload": name}},
                    "spec": {
                        "hostNetwork": True,
                        "dnsPolicy": "ClusterFirstWithHostNet",
                        "terminationGracePeriodSeconds": 30,
                        "serviceAccountName": SERVICE_ACCOUNT,
                        "nodeSelector": {
                            "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                            "cloud.google.com/gke-tpu-topology": target.topology,
                        },
                        "containers": [worker],
                        "tolerations": [{"operator": "Exists", "key": "google.com/tpu"}],  # XPK's is_tpu=True
                        "restartPolicy": "OnFailure",
                        "volumes": [_shared_tmp()],
                    },
                },
            },
        },
    }


def pathways_jobset(job: RenderedJob, target: Slice, run_name: str) -> dict:
    """train on the slice, shaped like `xpk workload create-pathways --tpu-type=v6e-N --num-slices=1`."""
    name = name_of(job.name, run_name)
    scratch = f"gs://{target.bucket}/pathways/{name}"
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": _metadata(
            job.name,
            job.outputs,
            target,
            run_name,
            {"kueue.x-k8s.io/queue-name": QUEUE, "xpk.google.com/workload": name},
        ),
        "spec": {
            "coordinator": {"replicatedJob": "pathways-head"},
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            # On Spot, a preempted node fails the slice's pods: JobSet recreates them all (XPK's --max-restarts),
            # Kueue keeps the workload admitted, the node pool brings new Spot nodes, and MaxText resumes from the
            # last checkpoint in the bucket. A train that fails for another reason is recreated as well.
            "failurePolicy": {"restartStrategy": "Recreate", **({"maxRestarts": SPOT_RESTARTS} if target.spot else {})},
            "replicatedJobs": [_head(job, target, scratch), _workers(name, target, scratch)],
            "startupPolicy": {"startupPolicyOrder": "InOrder"},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["pathways-head"]},
            "suspend": False,
        },
    }


def check_pathways(jobs: list[RenderedJob]) -> None:
    """MaxText 0.2.3 runs multi-host RL only through Pathways: refuse a trainer told not to use it."""
    for job in jobs:
        if job.progress and any(re.fullmatch(r"use_pathways=(false|False|0)", a) for a in job.argv):
            raise UserError(
                f"{job.name}: use_pathways=false: MaxText 0.2.3 runs GRPO on more than one host only through "
                "Pathways (rl.yml sets it true); remove the override"
            )


def manifests(jobs: list[RenderedJob], target: Slice, run_name: str) -> dict[str, dict]:
    """Each MaxText job's JobSet: the RL trainer on the slice through Pathways, the rest on CPU."""
    check_pathways(jobs)
    return {
        job.name: (pathways_jobset if job.progress else cpu_jobset)(job, target, run_name) for job in jobs if job.module
    }
