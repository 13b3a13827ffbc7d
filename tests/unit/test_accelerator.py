"""The slice's shape from one setting (vm.accelerator, auto: the stack's tpu-rl:machineType): every place that
names the chips renders from it, a job file that says otherwise than the stack is refused, and a machine whose
HBM cannot hold the run is refused before anything is made."""

from __future__ import annotations

import shutil

import pytest
import yaml

from bootstrap.demo import cpu
from bootstrap.errors import UserError
from bootstrap.jobs import accelerator, load, schema
from bootstrap.jobs.plan import build, expected_environment
from bootstrap.paths import REPO
from tests.pulumi.program import Stack, run_program

# The CPU tier's tiny model (bootstrap/demo/cpu.py): a run four or one v6e chips hold.
TINY = [f"{job}.{setting}" for job in ("convert", "train", "export") for setting in cpu.widths()]
GUIDE = {  # workload.md, section 3: what the guide sets for a ct6e-standard-8t
    "TPU_ACCELERATOR_TYPE": "v6e-8",
    "TPU_WORKER_ID": "0",
    "TPU_NAME": "${hostname}",
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_TOPOLOGY": "2x4",
    "TPU_CHIPS_PER_HOST_BOUNDS": "2,4,1",
    "TPU_HOST_BOUNDS": "1,1,1",
}


def plan_for(overrides=(), machine_type=None):
    return build(load.read(REPO / "jobs"), list(overrides), "r1", machine_type=machine_type)


def tpu_env(plan) -> dict[str, str]:
    return {k: v for k, v in plan.job("train").rendered.env.items() if k.startswith("TPU_") and "TPU_RL" not in k}


def test_the_default_is_the_guides_v6e_8():
    plan = plan_for()
    assert tpu_env(plan) == GUIDE and "chips_per_vm=8" in plan.job("train").rendered.argv
    assert plan.accelerator.source == "tpu-rl:machineType's default; no stack was read"


@pytest.mark.parametrize(
    ("machine_type", "chips", "topology", "bounds"),
    [("ct6e-standard-4t", 4, "2x2", "2,2,1"), ("ct6e-standard-1t", 1, "1x1", "1,1,1")],
)
def test_a_smaller_stack_renders_its_own_chips_everywhere(machine_type, chips, topology, bounds):
    """From the stack's machine type alone: train's TPU_ variables and chips_per_vm, the validate job's variables
    and the chips it proves, the VM's preflight and the run's chip-hours."""
    plan = plan_for(TINY, machine_type)
    env = tpu_env(plan)
    assert (env["TPU_ACCELERATOR_TYPE"], env["TPU_TOPOLOGY"], env["TPU_CHIPS_PER_HOST_BOUNDS"]) == (
        f"v6e-{chips}",
        topology,
        bounds,
    )
    assert f"chips_per_vm={chips}" in plan.job("train").rendered.argv
    assert plan.job("validate").runner_spec["env"]["TPU_TOPOLOGY"] == topology
    expected = expected_environment(plan.spec, plan.accelerator)
    assert (expected.chips, expected.chip_kind) == (chips, "TPU v6 lite")
    train = plan.job("train").rendered
    assert plan.accelerator.chips == chips and "v6e-8" not in f"{train.argv} {train.env}"


def test_a_job_file_that_pins_another_accelerator_than_the_stack_is_refused_in_one_line():
    files = load.read(REPO / "jobs")
    files.pipeline.data["vm"]["accelerator"] = "v6e-8"
    assert build(files, TINY, "r1").accelerator.chips == 8  # pinned, and no stack read: taken as it is
    with pytest.raises(UserError) as raised:
        build(files, TINY, "r1", machine_type="ct6e-standard-4t")
    message = str(raised.value)
    assert message.count("\n") == 0 and message.endswith(
        "vm.accelerator: v6e-8, but the stack's VM is ct6e-standard-4t (v6e-4): set vm.accelerator: auto (the "
        "stack's), or tpu-rl:machineType ct6e-standard-8t"
    )


@pytest.mark.parametrize(("machine_type", "room"), [("ct6e-standard-4t", 92), ("ct6e-standard-1t", 23)])
def test_a_machine_that_cannot_hold_the_8b_run_is_refused_with_the_numbers(machine_type, room):
    with pytest.raises(UserError) as raised:
        plan_for([], machine_type)
    message = str(raised.value)
    assert message.count("\n") == 0
    assert "8.0B parameters in bfloat16 x 6" in message and "is 96 GB" in message
    assert f"(hbm_utilization_vllm 0.72: {room} GB)" in message and "use v6e-8" in message


def test_llama_3_1_8b_has_its_8_billion_parameters():
    assert accelerator.parameters(schema.load().model_keys("llama3.1-8b")) == 8_030_261_248


@pytest.mark.parametrize(
    ("setting", "chips", "kind", "why"),
    [
        ("host", None, None, "vm.accelerator: host needs vm.chips (how many) and vm.chip_kind"),
        ("cpu", 1, None, "vm.chips and vm.chip_kind are for vm.accelerator: host; cpu has none"),
        ("v6e-8", 8, None, "vm.chips and vm.chip_kind come from vm.accelerator (v6e-8)"),
    ],
)
def test_the_chips_are_given_only_for_a_host_of_its_own(setting, chips, kind, why):
    assert accelerator.derive(setting, chips, kind, None)[1].startswith(why)


def test_a_host_of_its_own_sets_no_tpu_variable_and_is_checked_as_given():
    files = load.read(REPO / "jobs")
    files.pipeline.data["vm"].update(accelerator="host", chips=1, chip_kind="TPU v5 lite")
    plan = build(files, TINY, "r1")
    assert tpu_env(plan) == {} and "chips_per_vm=1" in plan.job("train").rendered.argv
    expected = expected_environment(plan.spec, plan.accelerator)
    assert (expected.chips, expected.chip_kind, expected.slice_env) == (1, "TPU v5 lite", {})


@pytest.mark.parametrize(
    ("setting", "chips", "kind", "has"),
    [("cpu", None, None, "cpu (no TPU)"), ("host", 4, "TPU v6 lite", "host (4 x TPU v6 lite)"),
     ("host", 8, "TPU v5 lite", "host (8 x TPU v5 lite)")],
)  # fmt: skip
def test_a_cpu_or_a_host_of_other_chips_on_a_v6e_stack_is_refused_in_one_line(setting, chips, kind, has):
    """What the review found passing fab and the Pulumi program, to fail only on the VM after setup."""
    _, why = accelerator.derive(setting, chips, kind, "ct6e-standard-8t")
    assert why == (
        f"{has}, but the stack's VM is ct6e-standard-8t: 8 x TPU v6 lite (v6e-8); set vm.accelerator: auto (the "
        "stack's)"
    )


def test_a_host_of_the_stacks_own_chips_is_taken_and_the_pulumi_program_refuses_a_cpu(tmp_path, monkeypatch):
    assert accelerator.derive("host", 8, "TPU v6 lite", "ct6e-standard-8t")[1] == ""
    jobs = tmp_path / "jobs"
    shutil.copytree(REPO / "jobs", jobs)
    files = load.read(jobs)
    files.pipeline.data["vm"]["accelerator"] = "cpu"
    (jobs / "pipeline.yaml").write_text(yaml.safe_dump(files.pipeline.data, sort_keys=False))
    monkeypatch.setenv("TPU_RL_JOBS", str(jobs))
    stack = Stack()
    with pytest.raises(Exception) as raised:
        run_program({}, stack=stack)
    assert type(raised.value).__name__ == "ConfigError" and stack.resources == []
    assert "vm.accelerator: cpu (no TPU), but the stack's VM is ct6e-standard-8t" in str(raised.value)
