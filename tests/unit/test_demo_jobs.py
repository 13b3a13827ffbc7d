"""fab demo's jobs: the user's own, with only what a CPU needs changed, and passing every check fab train makes
(no MaxText run: tests/maxtext_cpu/test_demo.py runs the demo itself)."""

from __future__ import annotations

import ast
import contextlib
import shutil
from pathlib import Path

import pytest
import yaml
from invoke import Context, Exit

from bootstrap.demo import MAKE_INPUTS, cpu, rehearsal
from bootstrap.errors import UserError
from bootstrap.jobs import load
from bootstrap.jobs.plan import build, check_local
from bootstrap.paths import REPO
from bootstrap.tasks import demo_tasks


@pytest.fixture
def folder(tmp_path) -> rehearsal.Folder:
    return rehearsal.Folder(tmp_path / "demo")


def test_the_demo_jobs_pass_fabs_own_checks_and_change_only_what_a_cpu_needs(folder):
    folder.root.mkdir()
    changes = rehearsal.write_jobs(REPO / "jobs", folder)
    files = load.read(folder.jobs)
    pipeline = check_local(files, rehearsal.overrides(folder))  # raises on any problem, as fab train would
    assert pipeline.spec.vm.accelerator == "cpu" and pipeline.spec.vm.autostop == "off"
    assert not pipeline.spec.results.hub_repo and not pipeline.spec.results.notify
    plan = build(files, rehearsal.overrides(folder), "demo-grpo-x")
    assert all(not job.secrets for job in plan.rendered)  # no token
    assert list(plan.job("prefetch").needs) == ["setup"]  # its Python is the environment's
    shipped, demo = (yaml.safe_load((d / "train.yaml").read_text()) for d in (REPO / "jobs", folder.jobs))
    assert {k: v for k, v in shipped.items() if k != "secrets"} == demo  # train itself: the user's
    for name in ("convert", "export"):  # MaxText's default compile cache is ~/jax_cache: outside the demo's folder
        assert f"jax_cache_dir={folder.root}/jax-cache" in plan.job(name).rendered.argv
    # train's is the user's (${durable_dir}/jax-cache), and the demo's durable_dir is in its folder
    (cache,) = [arg for arg in plan.job("train").rendered.argv if arg.startswith("jax_cache_dir=")]
    assert Path(cache.partition("=")[2]).is_relative_to(folder.root), cache
    assert len(changes) == 7 and any(line.startswith("vm: this machine's CPU") for line in changes)


def test_a_users_edit_to_the_jobs_is_what_the_demo_runs(folder, tmp_path):
    jobs = tmp_path / "jobs"
    shutil.copytree(REPO / "jobs", jobs)
    train = yaml.safe_load((jobs / "train.yaml").read_text())
    train["args"]["max_num_checkpoints_to_keep"] = 5
    (jobs / "train.yaml").write_text(yaml.safe_dump(train))
    pipeline = yaml.safe_load((jobs / "pipeline.yaml").read_text())
    pipeline["results"].update(wandb="my-project", mlflow="http://127.0.0.1:5000")  # trackers: nothing leaves
    (jobs / "pipeline.yaml").write_text(yaml.safe_dump(pipeline))
    folder.root.mkdir()
    rehearsal.write_jobs(jobs, folder)
    plan = build(load.read(folder.jobs), rehearsal.overrides(folder), "demo-grpo-x")
    assert "max_num_checkpoints_to_keep=5" in plan.job("train").rendered.argv
    assert not plan.spec.results.wandb and not plan.spec.results.mlflow
    assert plan.job("train").runner_spec["env"]["WANDB_MODE"] == "disabled"


def test_clean_leaves_a_folder_that_is_not_a_demos(folder, monkeypatch):
    folder.root.mkdir()
    (folder.root / "precious").write_text("mine")
    monkeypatch.setenv(rehearsal.ROOT_ENV, str(folder.root))
    with pytest.raises(Exit, match="is not a demo folder") as refused:
        demo_tasks.demo(Context(), clean=True)
    assert refused.value.code == 2 and (folder.root / "precious").read_text() == "mine"


def test_off_linux_the_demo_says_so_in_one_line_before_anything(folder, monkeypatch):
    monkeypatch.setattr(demo_tasks.sys, "platform", "darwin")
    monkeypatch.setenv(rehearsal.ROOT_ENV, str(folder.root))
    with pytest.raises(Exit, match="need Linux \\(this is darwin\\)"):
        demo_tasks.demo(Context())
    assert not folder.root.exists()


def test_the_demo_never_writes_into_a_folder_it_did_not_make(tmp_path, monkeypatch):
    """TPU_RL_DEMO=. in a clone: the demo would have replaced the clone's own jobs/ with its copy."""
    clone = tmp_path / "clone"
    shutil.copytree(REPO / "jobs", clone / "jobs")
    before = {p.name: p.read_bytes() for p in (clone / "jobs").iterdir() if p.is_file()}
    monkeypatch.setenv(rehearsal.ROOT_ENV, str(clone))
    with pytest.raises(Exit, match="is not a demo folder"):
        demo_tasks.demo(Context())
    assert {p.name: p.read_bytes() for p in (clone / "jobs").iterdir() if p.is_file()} == before
    with pytest.raises(Exit, match="is not a demo folder"):
        demo_tasks.demo(Context(), clean=True)
    assert (clone / "jobs" / "pipeline.yaml").exists()


def test_a_bucket_in_the_users_jobs_is_never_what_the_demo_writes_to(folder, tmp_path):
    jobs = tmp_path / "jobs"
    shutil.copytree(REPO / "jobs", jobs)
    pipeline = yaml.safe_load((jobs / "pipeline.yaml").read_text())
    pipeline["vars"]["durable_dir"] = "gs://my-bucket/ckpt"  # the user's own bucket, for their real runs
    (jobs / "pipeline.yaml").write_text(yaml.safe_dump(pipeline))
    rehearsal.write_jobs(jobs, folder)
    plan = build(load.read(folder.jobs), rehearsal.overrides(folder), "demo-grpo-x")
    words = [w for job in plan.rendered for w in [*job.argv, *job.env.values(), *job.outputs]]
    assert not [w for w in words if "gs://" in w]
    train = plan.job("train").rendered
    assert train.env["TPU_RL_CHECKPOINT_DIR"].startswith(f"{folder.root}/work/")  # the checkpoints: the demo's own


def test_a_demo_folder_in_this_repository_is_refused_and_never_made(monkeypatch):
    inside = REPO / "demo-inside-the-clone"
    monkeypatch.setenv(rehearsal.ROOT_ENV, str(inside))
    with pytest.raises(Exit, match="it is in this repository or holds it; set TPU_RL_DEMO elsewhere"):
        demo_tasks.demo(Context())
    assert not inside.exists()


def test_a_demo_folder_inside_the_jobs_it_copies_is_refused(tmp_path):
    jobs = tmp_path / "jobs"
    shutil.copytree(REPO / "jobs", jobs)
    with pytest.raises(UserError, match=f"is inside the jobs folder {jobs}: set TPU_RL_DEMO elsewhere"):
        rehearsal.write_jobs(jobs, rehearsal.Folder(jobs / "demo"))
    assert not (jobs / "demo").exists()


def test_a_bucket_a_users_job_names_itself_stops_the_demo_before_anything_runs(folder, tmp_path, monkeypatch):
    """Not a path the demo sets (those are its folder's): the user's own train.yaml names a bucket."""
    jobs = tmp_path / "jobs"
    shutil.copytree(REPO / "jobs", jobs)
    train = yaml.safe_load((jobs / "train.yaml").read_text())
    train["env"]["MY_DATA"] = "gs://my-bucket/data"
    (jobs / "train.yaml").write_text(yaml.safe_dump(train))
    monkeypatch.setenv("TPU_RL_JOBS", str(jobs))
    monkeypatch.setenv("TPU_RL_RUNS", str(tmp_path / "runs"))  # the demo points both at its folder: put back after
    monkeypatch.setenv(rehearsal.ROOT_ENV, str(folder.root))
    with pytest.raises(Exit, match=r"the demo's jobs would use a bucket \(gs://my-bucket/data\)"):
        demo_tasks.demo(Context())
    assert not list(folder.state.glob("runs/*/*/log"))  # no job started


def constants(path: Path) -> dict[str, object]:
    """The module-level constants a script assigns (read, not imported: make_inputs.py needs MaxText's venv)."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            with contextlib.suppress(ValueError):
                value = ast.literal_eval(node.value)
                names = [target] if isinstance(target, ast.Name) else getattr(target, "elts", [])
                values = [value] if isinstance(target, ast.Name) else value
                found |= {name.id: v for name, v in zip(names, values, strict=True) if isinstance(name, ast.Name)}
    return found


def test_the_tiny_models_settings_are_the_widths_make_inputs_gives_it():
    """cpu.py tells MaxText's jobs the widths make_inputs.py builds the model with: a width changed in one alone
    would show only in the slow tier, as a converter's shape error."""
    made = constants(MAKE_INPUTS)
    assert sorted(cpu.widths()) == sorted(  # each setting once: a leftover second one would show
        [
            "override_model_config=True",
            f"base_emb_dim={made['HIDDEN']}",
            f"base_mlp_dim={made['INTERMEDIATE']}",
            f"head_dim={made['HEAD_DIM']}",
            f"vocab_size={made['VOCAB']}",
            f"base_num_query_heads={made['HEADS'][0]}",
            f"base_num_kv_heads={made['HEADS'][1]}",
        ]
    )
