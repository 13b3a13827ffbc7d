"""The shipped jobs render to the reference workload's commands, corrected (workload.md 3 and 4)."""

import json
import os
import re
import shlex
import shutil

import pytest
import yaml

from bootstrap.errors import UserError
from bootstrap.jobs import load
from bootstrap.jobs.check import check_pipeline
from bootstrap.jobs.load import render
from bootstrap.paths import REPO


def load_pipeline(directory, overrides=(), provided=None):
    return load.resolve(load.read(directory), overrides, provided)


RUN = "2026-11-30-12-00-00"
# The guide's shared settings (section 3), and its commands with the five corrections applied:
# the Instruct model name in every job, hardware=cpu skip_jax_distributed_system=true on export,
# no hf_access_token argument, RL keys under rl. (the guide sets none), and the learning-rate
# schedule sized to the run (0: the run's own length; unset, MaxText 0.2.3 sizes it to 150001 steps). And one
# workaround: train runs through maxtext_run.py, as `python -m` would, so that it can exit. And a
# checkpoint every tenth of the run, two kept (rl.yml: every 50 steps, ten kept). And the run's folders in
# /dev/shm are in a folder of the SSH user's own (tpu-rl, the stack's default), never in one another account made.
WORK = "/dev/shm/tpu-rl-tpu-rl/llama3.1-8b-Instruct"
GUIDE_VARS = {
    "MODEL_NAME": "llama3.1-8b-Instruct",
    "MODEL_CHECKPOINT_DIRECTORY": f"{WORK}/mt-format/",
    "BASE_OUTPUT_DIRECTORY": f"{WORK}/post-train/",
    "RUN_NAME": RUN,
    "NUM_BATCHES": "50",
}
REFERENCE = {
    "convert": """python3 -m maxtext.checkpoint_conversion.to_maxtext model_name=llama3.1-8b-Instruct
      base_output_directory=$MODEL_CHECKPOINT_DIRECTORY scan_layers=True use_multimodal=False
      hardware=cpu skip_jax_distributed_system=true
      checkpoint_storage_use_zarr3=1 checkpoint_storage_use_ocdbt=1 --lazy_load_tensors=False""",
    "train": """python3 -m maxtext.trainers.post_train.rl.train_rl model_name=llama3.1-8b-Instruct
      load_parameters_path=$MODEL_CHECKPOINT_DIRECTORY/0/items run_name=$RUN_NAME
      base_output_directory=$BASE_OUTPUT_DIRECTORY chips_per_vm=8 num_batches=50
      learning_rate_schedule_steps=0 checkpoint_period=5 max_num_checkpoints_to_keep=2 num_test_batches=42 eval_batch_size=32 rollout_data_parallelism=1 rollout_tensor_parallelism=-1
      jax_cache_dir=$WORK/jax-cache""",
    "export": """python3 -m maxtext.checkpoint_conversion.to_huggingface model_name=llama3.1-8b-Instruct
      load_parameters_path=$BASE_OUTPUT_DIRECTORY/$RUN_NAME/checkpoints/actor/$NUM_BATCHES/model_params
      base_output_directory=$WORK/hf-trained/ scan_layers=True
      use_multimodal=False weight_dtype=bfloat16 hardware=cpu skip_jax_distributed_system=true""",
}
TRAIN_ENV = {
    "TPU_ACCELERATOR_TYPE": "v6e-8",
    "TPU_WORKER_ID": "0",
    "TPU_NAME": "${hostname}",  # the guide's $(hostname), looked up on the VM
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_TOPOLOGY": "2x4",
    "TPU_CHIPS_PER_HOST_BOUNDS": "2,4,1",
    "TPU_HOST_BOUNDS": "1,1,1",
}


def normalize(arg: str) -> str:
    """The guide's paths carry trailing and doubled slashes ($DIR/ + /0/items): compare them as paths."""
    key, sep, value = arg.partition("=")
    return f"{key}={os.path.normpath(value)}" if sep and value.startswith("/") else arg


def reference_argv(job: str, key: str) -> list[str]:
    text = REFERENCE[job]
    for name, value in {
        "WORK": WORK,
        **GUIDE_VARS,
        "MODEL_CHECKPOINT_DIRECTORY": f"{GUIDE_VARS['MODEL_CHECKPOINT_DIRECTORY']}{key}",
    }.items():
        text = text.replace(f"${name}", value)
    return [normalize(a) for a in shlex.split(text)]


def rendered(overrides=()) -> dict:
    return {job.name: job for job in render(load_pipeline(REPO / "jobs", list(overrides), {"run_name": RUN}))}


@pytest.fixture(scope="module")
def jobs():
    return rendered()


def converted(jobs) -> str:
    """The converted checkpoint's folder: the guide's, plus convert's key (see test_converted_folder_...)."""
    return f"{WORK}/mt-format/{jobs['convert'].key}"


def test_run_order(jobs):
    assert list(jobs) == ["prefetch", "convert", "train", "export"]


@pytest.mark.parametrize("name", ["convert", "train"])
def test_argv_matches_reference(jobs, name):
    argv = jobs[name].argv
    assert argv[0] == "~/maxtext_venv/bin/python3"
    expected = reference_argv(name, jobs["convert"].key)[1:]
    if name == "train":  # the launcher runs the module in place of `python -m`
        expected[0] = "tpu-rl/bin/maxtext_run.py"
    assert [normalize(a) for a in argv[1:]] == expected


def test_export_argv_matches_reference_but_finds_the_last_step_itself(jobs):
    expected = reference_argv("export", jobs["convert"].key)[1:]
    actor = f"{WORK}/post-train/{RUN}/checkpoints/actor"
    expected[expected.index(f"load_parameters_path={actor}/50/model_params")] = (
        f"load_parameters_path={actor}/${{latest_step:{actor}}}/model_params"
    )
    # Each run exports into its own folder, so a later run never overwrites an earlier export.
    expected[expected.index(f"base_output_directory={WORK}/hf-trained")] += f"/{RUN}"
    assert [normalize(a) for a in jobs["export"].argv[1:]] == expected


def test_train_environment(jobs):
    run_dir = f"{WORK}/post-train/{RUN}"
    assert jobs["train"].env == {
        "HF_HOME": "~/.cache/huggingface",
        **TRAIN_ENV,
        # tpu-rl's own: where each start is recorded, and whose last committed step it resumes from
        "TPU_RL_ATTEMPTS_DIR": f"{run_dir}/attempts",
        "TPU_RL_CHECKPOINT_DIR": f"{run_dir}/checkpoints/actor",
        "TPU_RL_EVALS_DIR": f"{run_dir}/evals",  # and each eval, which the publish gate judges the run by
        "WANDB_MODE": "disabled",  # tunix logs to W&B whenever wandb imports: off unless results.wandb
        "TPU_RL_EVAL_SAMPLE_BATCHES": "4",  # the evals during training on a sample (before and after: whole)
        # the health rules as pipeline.yaml's defaults give them (tests/unit/test_health.py: what each does)
        "TPU_RL_HEALTH": json.dumps(
            {
                "agreement": False,
                "agreement_stop": 1.5,
                "agreement_warn": 1.05,
                "kl_max": 1.0,
                "length_steps": 10,
                "max_tokens": 768,
                "reward_floor_steps": 20,
                "smoke": True,
                "smoke_right": 1,
            }
        ),  # fmt: skip
    }


def test_token_only_as_a_declared_secret(jobs):
    for job in jobs.values():
        assert job.secrets == ["HF_TOKEN"]
        assert not any("hf_access_token" in a or "HF_TOKEN" in a for a in job.argv)


def test_outputs_decide_done(jobs):
    assert jobs["convert"].outputs == [f"{converted(jobs)}/0/items"]
    assert jobs["train"].outputs == [f"{WORK}/post-train/{RUN}/checkpoints/actor/*/model_params"]
    assert jobs["export"].outputs[1].endswith(f"hf-trained/{RUN}/generation_config.json")
    assert jobs["export"].needs == ["setup", "train"] and jobs["convert"].needs == ["setup", "prefetch"]


def test_prefetch_fills_the_cache_convert_reads():
    prefetch = render(load_pipeline(REPO / "jobs", [], {"run_name": RUN}))[0]
    assert prefetch.argv == [
        "uv", "tool", "run", "--from", "huggingface_hub==2.4.0", "hf", "download", "meta-llama/Llama-3.1-8B-Instruct"
    ]  # fmt: skip
    assert prefetch.module is None and prefetch.needs == []
    assert prefetch.env["HF_HOME"] == "~/.cache/huggingface"


def test_shipped_jobs_pass_the_local_check():
    assert check_pipeline(load_pipeline(REPO / "jobs", [], {"run_name": RUN})) == []


def test_overrides_change_only_what_they_name():
    overridden = {
        j.name: j
        for j in render(
            load_pipeline(
                REPO / "jobs",
                ["train.num_batches=100", "train.rl.num_generations=4", "vars.model_name=llama3.1-8b-Instruct"],
                {"run_name": RUN},
            )
        )
    }
    assert "num_batches=100" in overridden["train"].argv
    assert overridden["train"].argv[-1] == "rl.num_generations=4"
    assert "num_batches=50" not in overridden["train"].argv


def test_converted_folder_is_named_by_what_convert_does(jobs):
    """A convert with other arguments writes beside the first checkpoint, never over it, and train loads
    the one its convert made; the folder's name is the convert's shared key."""
    other = rendered(["convert.scan_layers=False"])
    assert re.fullmatch(r"[0-9a-f]{12}", jobs["convert"].key) and other["convert"].key != jobs["convert"].key
    for run in (jobs, other):
        assert run["convert"].outputs == [f"{converted(run)}/0/items"]
        assert f"base_output_directory={converted(run)}" in run["convert"].argv
        assert f"load_parameters_path={converted(run)}/0/items" in run["train"].argv
        assert run["train"].inputs == [f"{converted(run)}/0/items"]
    assert rendered()["convert"].key == jobs["convert"].key  # the same definition, the same folder
    assert rendered(["train.num_batches=7"])["convert"].key == jobs["convert"].key


def test_a_convert_to_another_place_is_another_job():
    """Its key names its job folder on the VM too: a convert done into /dev/shm is not done in a bucket."""
    local, bucket = rendered(), rendered(["vars.durable_dir=gs://b/p/llama"])
    assert local["convert"].key != bucket["convert"].key
    assert bucket["convert"].outputs == [f"gs://b/p/llama/mt-format/{bucket['convert'].key}/0/items"]


def test_train_keeps_its_compiled_programs_where_the_checkpoints_are():
    """A new VM that resumes the run finds JAX's cache in the bucket (base.yml's ~/jax_cache is lost with the VM)."""
    assert "jax_cache_dir=gs://b/p/llama/jax-cache" in rendered(["vars.durable_dir=gs://b/p/llama"])["train"].argv


def test_a_key_of_no_job_is_refused_with_its_origin():
    with pytest.raises(UserError) as err:
        load_pipeline(REPO / "jobs", ["vars.checkpoint_dir=/dev/shm/m/${key:convrt}"], {"run_name": RUN})
    text = str(err.value)
    assert "convert.yaml" in text and "args.base_output_directory" in text
    assert "${key:convrt} names no job; jobs are prefetch, convert, train, export" in text


def test_a_key_covers_the_keys_it_names(tmp_path):
    """A job that reads convert's folder (through ${checkpoint_dir}) and is shared by runs changes its own
    key, and so its folder, when convert's arguments change: never "done already" for the other checkpoint."""
    for path in (REPO / "jobs").glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "inspect.yaml").write_text(
        "description: look at the converted checkpoint\ncommand: [ls, '${checkpoint_dir}']\nneeds: [convert]\n"
        "outputs: ['/dev/shm/inspected/${key:inspect}']\n"
    )
    pipeline = (tmp_path / "pipeline.yaml").read_text()
    (tmp_path / "pipeline.yaml").write_text(
        pipeline.replace(
            "jobs: [prefetch, convert, train, export]", "jobs: [prefetch, convert, inspect, train, export]"
        )
    )

    def keys(overrides=()):
        return {j.name: j.key for j in render(load_pipeline(tmp_path, list(overrides), {"run_name": RUN}))}

    first, other = keys(), keys(["convert.scan_layers=False"])
    assert other["convert"] != first["convert"] and other["inspect"] != first["inspect"]
    assert keys(["train.num_batches=7"])["inspect"] == first["inspect"]


def test_a_command_that_runs_the_environments_python_waits_for_it(tmp_path):
    """fab demo's prefetch makes its inputs with the venv's Python: it must start only once setup built the venv."""
    shutil.copytree(REPO / "jobs", tmp_path / "jobs")
    prefetch = tmp_path / "jobs" / "prefetch.yaml"
    spec = yaml.safe_load(prefetch.read_text())
    spec["command"] = ["${python}", "make_inputs.py"]
    prefetch.write_text(yaml.safe_dump(spec))
    rendered = render(load_pipeline(tmp_path / "jobs", [], {"run_name": RUN}))[0]
    assert rendered.argv[0].endswith("/bin/python3") and rendered.needs == ["setup"]
