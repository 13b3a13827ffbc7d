"""The gke backend's JobSets: train is the JobSet `xpk workload create-pathways` renders, field by field.

XPK 1.16.0's own template (templates/pathways_workload_create.yaml.j2) is rendered offline with
Jinja, as XPK renders it for `--tpu-type=v6e-16 --num-slices=1`, around our trainer container;
the two documents must be equal but for the differences listed in DELIBERATE.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
from argparse import Namespace

import jinja2
import pytest
import yaml

from bootstrap.errors import UserError
from bootstrap.gke import jobsets
from bootstrap.jobs import load
from bootstrap.jobs.plan import build
from bootstrap.paths import REPO
from tests import fabfork, kubestub, xpk

IMAGE = "us-docker.pkg.dev/my-project/tpu-rl/maxtext:0.2.3"
TARGET = jobsets.Slice(bucket="my-results", topology="4x4", image=IMAGE)
RUN = "2026-11-30-12-00-00"
ONE_TO_ONE = "alpha.jobset.sigs.k8s.io/exclusive-topology: cloud.google.com/gke-nodepool"
# Ours differs from XPK's on purpose in exactly these places.
DELIBERATE = {
    "serviceAccountName": "pods run as tpu-rl/tpu-rl-jobs: Workload Identity to the stack's bucket only",
    "priorityClassName": "XPK's priority classes are not part of this cluster; one queue, one workload at a time",
}
# Pod volumes we add (the trainer container, mounts included, is ours in both documents).
DELIBERATE_VOLUMES = {
    "tools": "the tpu-rl-tools ConfigMap: train_rl runs through maxtext_run.py, which closes MaxText 0.2.3's "
    "math_verify grader pool so that the trainer can exit",
}


def rendered_jobs(overrides=()) -> list:
    files = load.read(REPO / "jobs")
    return build(files, [*jobsets.overrides(TARGET), *overrides], RUN).rendered


def xpk_rendering(trainer: dict, name: str) -> dict:
    """XPK's template, rendered with the values `xpk workload create-pathways` passes (commands/workload.py)."""
    templates = xpk.install() / "templates"
    system = xpk.system("v6e-16")
    from xpk.core.system_characteristics import create_accelerator_label, create_machine_label

    # core/scheduling.py ONE_TO_ONE_REPLICA_NODE_POOL_ASSIGNMENT_ANNOTATION (that module needs `kubernetes`)
    assert ONE_TO_ONE in (xpk.install() / "core" / "scheduling.py").read_text()
    container = {k: v for k, v in trainer.items() if k != "env"}
    container["env"] = [
        e
        for e in trainer["env"]
        if e["name"] not in ("PATHWAYS_HEAD", "JAX_PLATFORMS", "XCLOUD_ENVIRONMENT", "JAX_BACKEND_TARGET")
    ]
    text = yaml.safe_dump([container], sort_keys=False)
    user_container = "\n".join("              " + line for line in text.splitlines())
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)), trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True
    )
    args = Namespace(
        workload=name,
        headless=False,
        pathways_gcs_location=f"gs://my-results/pathways/{name}",
        elastic_slices=0,
        custom_pathways_proxy_server_args=None,
        custom_pathways_server_args=None,
        custom_pathways_worker_args=None,
        colocated_python_sidecar_image=None,
        num_slices=1,
        termination_grace_period_seconds=30,
        priority="medium",
    )
    document = environment.get_template("pathways_workload_create.yaml.j2").render(
        args=args,
        local_queue_name="multislice-queue",
        proxy_server_image=jobsets.PROXY_IMAGE,
        server_image=jobsets.SERVER_IMAGE,
        instance_type=f"{system.pathways_tpu_version}:{system.topology}",
        user_workload_container=user_container,
        user_workload_env_vars=[
            {"name": "PATHWAYS_HEAD", "valueFrom": "metadata.labels['jobset.sigs.k8s.io/coordinator']"},
            {"name": "JAX_PLATFORMS", "value": "proxy"},
            {"name": "XCLOUD_ENVIRONMENT", "value": "GCP"},
            {"name": "JAX_BACKEND_TARGET", "value": "grpc://$(PATHWAYS_HEAD):29000"},
        ],
        worker_backoff_limit=system.vms_per_slice * 4,
        vms_per_slice=system.vms_per_slice,
        workload_system=system,
        accelerator_label=create_accelerator_label(system),
        node_selector_machine_label=create_machine_label(system),
        placement_policy_label="",
        tpu_slice_topology_annotation="",  # no super-slicing on v6e
        jobset_annotations=ONE_TO_ONE,  # no sub-slicing: one slice per pool
        autoprovisioning_args="",
        worker_image=jobsets.SERVER_IMAGE,
        is_tpu=True,  # what `xpk workload create-pathways` passes for a TPU slice
    )
    return yaml.safe_load(document)


def normalized(document: dict) -> dict:
    """Drop the DELIBERATE fields and our own labels; order env lists by name (order carries no meaning)."""
    document = copy.deepcopy(document)

    def walk(node):
        if isinstance(node, dict):
            for key in DELIBERATE:
                node.pop(key, None)
            if "tpu-rl/job" in node:
                node.pop("tpu-rl/job")
            if isinstance(node.get("volumes"), list):
                node["volumes"] = [v for v in node["volumes"] if v["name"] not in DELIBERATE_VOLUMES]
            if isinstance(node.get("env"), list):
                node["env"] = sorted(node["env"], key=lambda e: e["name"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    document["metadata"].pop("namespace", None)  # XPK applies into the current namespace
    document["metadata"].pop("annotations", None)  # ours: the outputs that decide done
    return document


def containers(jobset: dict) -> list[dict]:
    pods = [job["template"]["spec"]["template"]["spec"] for job in jobset["spec"]["replicatedJobs"]]
    return [c for pod in pods for c in pod.get("initContainers", []) + pod["containers"]]


def test_train_is_xpks_pathways_jobset_for_v6e_16():
    train = jobsets.manifests(rendered_jobs(), TARGET, RUN)["train"]
    trainer = train["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    reference = xpk_rendering(trainer, train["metadata"]["name"])
    assert normalized(train) == normalized(reference)


def test_train_carries_pathways_settings_and_the_token_only_by_reference():
    jobs = rendered_jobs()
    train = jobsets.manifests(jobs, TARGET, RUN)["train"]
    convert_key = next(job.key for job in jobs if job.name == "convert")
    trainer = train["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in trainer["env"]}
    assert env["JAX_PLATFORMS"] == "proxy" and env["ENABLE_PATHWAYS_PERSISTENCE"] == "1"
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "tpu-rl-hf-token", "key": "HF_TOKEN"}}
    assert not any(name.startswith("TPU_") for name in env)  # the single VM's settings are dropped
    argv = trainer["command"]
    assert argv[:3] == ["python3", "/tpu-rl/tools/maxtext_run.py", "maxtext.trainers.post_train.rl.train_rl"]
    assert {"name": "tools", "mountPath": "/tpu-rl/tools"} in trainer["volumeMounts"]
    for arg in ("chips_per_vm=4", "checkpoint_storage_use_ocdbt=False", "checkpoint_storage_use_zarr3=False"):
        assert arg in argv
    assert "base_output_directory=gs://my-results/llama3.1-8b-Instruct/post-train" in argv
    assert f"load_parameters_path=gs://my-results/llama3.1-8b-Instruct/mt-format/{convert_key}/0/items" in argv
    tokens = [e for c in containers(train) for e in c.get("env", []) if e["name"] == "HF_TOKEN"]
    assert tokens and all("value" not in e for e in tokens)  # by reference to the Secret, never a value


def test_convert_and_export_run_on_the_cpu_pool_without_a_queue():
    manifests = jobsets.manifests(rendered_jobs(), TARGET, RUN)
    assert set(manifests) == {"convert", "train", "export"}  # prefetch is a plain command: the VM's cache only
    for name in ("convert", "export"):
        pod = manifests[name]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu-np"}
        assert "kueue.x-k8s.io/queue-name" not in manifests[name]["metadata"]["labels"]  # Kueue's quota is TPUs
        assert pod["containers"][0]["image"] == IMAGE


def test_multi_host_rl_without_pathways_is_refused():
    with pytest.raises(UserError, match="use_pathways=false: MaxText 0.2.3 runs GRPO on more than one host only"):
        jobsets.manifests(rendered_jobs(["train.use_pathways=false"]), TARGET, RUN)


def test_fab_plan_json_on_a_gke_stack_config(tmp_path):
    stack = REPO / "Pulumi.gke-test.yaml"
    stack.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "gcp:project": "my-project",
                    "gcp:zone": "us-east5-b",
                    "tpu-rl:reservation": "r",
                    "tpu-rl:backend": "gke",
                    "tpu-rl:gkeTopology": "4x4",
                    "tpu-rl:resultsBucket": "my-results",
                }
            }
        )
    )
    jobs = tmp_path / "jobs"
    shutil.copytree(REPO / "jobs", jobs)
    pipeline = jobs / "pipeline.yaml"
    pipeline.write_text(pipeline.read_text().replace('  image: ""', f"  image: {IMAGE}"))
    env = {**os.environ, "TPU_RL_JOBS": str(jobs), "TPU_RL_RUNS": str(tmp_path / "runs"), "HOME": str(tmp_path)}
    fab = fabfork.FAB
    try:
        shown = fabfork.run([fab, "plan", "--json", "--stack", "gke-test"], env=env, capture_output=True, text=True)
        as_yaml = fabfork.run([fab, "plan", "--stack", "gke-test"], env=env, capture_output=True, text=True)
        pipeline.write_text(pipeline.read_text().replace(f"  image: {IMAGE}", '  image: ""'))
        no_image = fabfork.run([fab, "plan", "--stack", "gke-test"], env=env, capture_output=True, text=True)
    finally:
        stack.unlink()
    assert shown.returncode == 0, shown.stderr
    train = next(m for m in json.loads(shown.stdout) if m["metadata"]["labels"]["tpu-rl/job"] == "train")
    workers = train["spec"]["replicatedJobs"][1]["template"]["spec"]
    assert workers["completions"] == xpk.system("v6e-16").vms_per_slice == 4
    assert no_image.returncode == 2 and "gke.image: missing" in no_image.stderr
    assert as_yaml.stdout.startswith("# a new run: 'new-run' stands for the name fab train gives it\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("config: [\n", ".yaml:2: yaml: not valid YAML"),
        ('config: !!python/object/apply:os.system ["true"]\n', ".yaml:1: config: must be a mapping"),
        ("- a\n- b\n", ".yaml:1: yaml: must be a mapping of keys to values"),
        ("config:\n  tpu-rl:backend: gke\n  tpu-rl:backend: vm\n", ".yaml:3: config.tpu-rl:backend: duplicate key"),
    ],
)
def test_a_broken_stack_file_is_one_line_with_its_line(tmp_path, text, message):
    name = f"broken-{os.getpid()}-{tmp_path.name}"  # unique across test workers: their tmp_path names repeat
    stack = REPO / f"Pulumi.{name}.yaml"
    stack.write_text(text)
    env = {**os.environ, "TPU_RL_RUNS": str(tmp_path / "runs"), "HOME": str(tmp_path)}
    try:
        result = fabfork.run(
            [fabfork.FAB, "plan", "--stack", name],
            env=env,
            capture_output=True,
            text=True,
        )
    finally:
        stack.unlink()
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"Pulumi.{name}{message}" in result.stderr


def test_a_stack_name_that_is_a_path_is_refused():
    result = fabfork.run(
        [fabfork.FAB, "-r", str(REPO), "plan", "--stack", "../etc"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "--stack '../etc': not a stack name" in result.stderr


def test_the_trainer_has_xpks_pathways_resources_and_privilege():
    """What `xpk workload create-pathways` gives the user's container (core/docker_resources.py, docker_container.py)."""
    source = (xpk.install() / "core" / "docker_resources.py").read_text()
    cpu, memory = re.search(r'resources_yaml = """cpu: "(\d+)"\s+memory: (\S+)"""', source).groups()
    assert "privileged: true" in (xpk.install() / "core" / "docker_container.py").read_text()
    train = jobsets.manifests(rendered_jobs(), TARGET, RUN)["train"]
    trainer = train["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert trainer["resources"] == {"limits": {"cpu": cpu, "memory": memory}}
    assert trainer["securityContext"] == {"privileged": True}


def test_convert_and_export_pods_are_guaranteed_memory_for_the_8b_model():
    jobs = jobsets.manifests(rendered_jobs(), TARGET, RUN)
    for name, memory in (("convert", "128Gi"), ("export", "64Gi")):
        pod = jobs[name]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        resources = pod["containers"][0]["resources"]
        assert resources["requests"] == resources["limits"] == {"cpu": "16", "memory": memory}  # QoS Guaranteed


def hub_pod(card: str, folder: str = "/gcs/llama3.1-8b-Instruct/hf-trained/r1") -> dict:
    target = jobsets.Slice(bucket="my-results", topology="4x4", image="img")
    jobset = jobsets.hub_jobset("publish-hub", folder, "u/m", ["--private"], {"HF_ENDPOINT": "https://h"}, card,
                                target, "r1")  # fmt: skip
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]


def test_the_hub_upload_pod_gets_its_card_and_command_exactly_as_written_after_kubernetes_expansion():
    """The kubelet expands $(NAME) and $$ in commands and env values: a card (or a path) holding them must
    reach the pod unchanged, and never pull the token (defined in the same pod) into a value or an argv."""
    card = "cost $$5, $(HF_TOKEN) and $(HF_ENDPOINT), $HOME"
    container = hub_pod(card)
    values = {"HF_TOKEN": "hf_secret", "HF_ENDPOINT": "https://h"}
    env = {e["name"]: kubestub.expand(e["value"], values) for e in container["env"] if "value" in e}
    assert env["TPU_RL_CARD"] == card
    script = kubestub.expand(container["command"][2], {**values, **env})
    assert "hf_secret" not in script and '"$TPU_RL_CARD"' in script
    assert script.endswith(
        "/tpu-rl/tools/hub_upload.py /gcs/llama3.1-8b-Instruct/hf-trained/r1 u/m --private --card "
        "/tmp/tpu-rl-card/card.md --marker /gcs/published/r1/hub-u--m.json"
    )
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "tpu-rl-hf-token", "key": "HF_TOKEN"}}} in (
        container["env"]
    )


def test_a_hub_upload_of_an_export_outside_the_bucket_is_refused():
    with pytest.raises(UserError, match=r"vars.export_dir=/dev/shm/x: on gke the export must be in the bucket"):
        hub_pod("card", folder="/dev/shm/x")


def test_a_value_means_the_same_in_a_pod_as_on_the_vm():
    """Kubernetes expands $(NAME) and $$ in commands and env values: every value is escaped, so the words
    the kubelet hands the container (kubestub.expand, its rule) are the VM's words, and `$(HF_TOKEN)` in
    an argument never becomes the token on the trainer's command line."""
    overrides = ["train.run_name=cost$$5-$(HF_TOKEN)", "train.env.NOTE=$(HF_TOKEN) and $$"]
    jobs = {job.name: job for job in rendered_jobs(overrides)}
    train = jobsets.manifests(list(jobs.values()), TARGET, RUN)["train"]
    trainer = train["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: kubestub.expand(e["value"], {"HF_TOKEN": "hf_secret"}) for e in trainer["env"] if "value" in e}
    words = [kubestub.expand(word, {"HF_TOKEN": "hf_secret", **env}) for word in trainer["command"]]
    assert "run_name=cost$$5-$(HF_TOKEN)" in words and "hf_secret" not in " ".join(words)
    assert env["NOTE"] == "$(HF_TOKEN) and $$" == jobs["train"].env["NOTE"]


def test_a_plan_too_large_for_one_environment_value_is_refused_in_one_line():
    """The driver's plan travels in one environment value: past Linux's 128 KiB its pod could never start."""
    fits = {"run": "r1", "digest": "d", "jobs": [{"name": "train", "note": "x" * 100_000}]}
    assert json.loads(jobsets.driver_jobset(fits, TARGET, "r1")["spec"]["replicatedJobs"][0]["template"]["spec"]
                      ["template"]["spec"]["containers"][0]["env"][0]["value"]) == fits  # fmt: skip
    too_large = {**fits, "jobs": [{"name": "train", "note": "$" * 70_000}]}  # each $ escaped as $$: 140 KB
    with pytest.raises(UserError, match=r"^the pipeline's plan is 137 KiB, beyond the 128 KiB .*nothing was created"):
        jobsets.driver_jobset(too_large, TARGET, "r1")
