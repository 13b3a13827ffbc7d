"""The environment check (remote/envcheck.py): its judging from given facts, and the real check on fake installs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.jobs import load
from bootstrap.jobs.plan import build, expected_environment
from bootstrap.paths import REPO
from bootstrap.remote import envcheck
from bootstrap.remote.envcheck import Expected, Facts, Installed

CHECK = REPO / "bootstrap" / "remote" / "maxtext_check.py"
TUNIX = "https://github.com/google/tunix/archive/683256db1a0919b5cfd46cee52cebc96331494fb.zip"
VLLM_REPO = "https://github.com/vllm-project/vllm"
VLLM_COMMIT = "2131b597b18d051dced4c4a605d362fa37f46ed1"
PINS = {"google-tunix": TUNIX, "vllm": f"git+{VLLM_REPO}@{VLLM_COMMIT}"}
V6E = "TPU v6 lite"
ON_THE_VM = Expected(8, V6E, {"google-tunix": "maxtext", "vllm": "maxtext"})
VLLM_FROM_GIT = Installed("0.1.dev1+g2131b59", {"url": VLLM_REPO, "vcs_info": {"vcs": "git", "commit_id": VLLM_COMMIT}})
UV_LINE = "The package `tpu-inference` requires `numba==0.62.1`, but `0.65.1` is installed"


def facts(**changes) -> Facts:
    """What a correct v6e-8 environment reports; `changes` break one part of it."""
    base = {
        "platform": "tpu",
        "device_kinds": [V6E] * 8,
        "jax_error": None,
        "installed": {"google-tunix": Installed("0.1.7", {"url": TUNIX, "archive_info": {}}), "vllm": VLLM_FROM_GIT},
        "pins": PINS,
        "maxtext": "0.2.3",
        "conflicts": [],
    }
    return Facts(**{**base, **changes})


def test_the_environment_the_spec_expects_has_no_problem():
    assert envcheck.problems(ON_THE_VM, facts()) == []
    assert envcheck.summary(ON_THE_VM, facts()).startswith("ok: JAX sees 8 tpu device(s); google-tunix 0.1.7, vllm")


@pytest.mark.parametrize(
    ("seen", "line"),
    [
        (
            {"device_kinds": [V6E] * 4},
            "accelerator: JAX sees 4 tpu device(s) (TPU v6 lite), vm.accelerator expects 8 tpu devices (TPU v6 lite)",
        ),
        (
            {"platform": "cpu", "device_kinds": ["cpu"]},
            "accelerator: JAX sees 1 cpu device(s) (cpu), vm.accelerator expects 8",
        ),
        (
            {"device_kinds": ["TPU v5 lite"] * 8},
            "accelerator: JAX sees 8 tpu device(s) (TPU v5 lite), vm.accelerator expects 8 tpu devices",
        ),
        (
            {"platform": "", "device_kinds": [], "jax_error": "RuntimeError: TPU initialization failed"},
            "accelerator: JAX could not list its devices: RuntimeError: TPU initialization failed",
        ),
    ],
)
def test_a_wrong_accelerator_is_one_line(seen, line):
    found = envcheck.problems(ON_THE_VM, facts(**seen))
    assert len(found) == 1 and found[0].startswith(line), found


def test_a_host_of_another_slice_names_the_setting_and_its_variables():
    """On a host that is not the slice vm.accelerator names, libtpu cannot start with its TPU_ variables (seen on a
    v5e host with v6e-8's); the line says which setting made them and what they were."""
    plan = build(load.read(REPO / "jobs"), [], "run-1")
    expected = expected_environment(plan.spec, plan.accelerator)
    error = "RuntimeError: Unable to initialize backend 'tpu': INTERNAL: Failed to get global TPU topology."
    found = envcheck.accelerator_problem(expected, facts(platform="", device_kinds=[], jax_error=error))
    assert found == (
        "accelerator: libtpu cannot start with vm.accelerator v6e-8 (tpu-rl:machineType's default; no stack was "
        "read)'s slice (TPU_ACCELERATOR_TYPE=v6e-8 TPU_TOPOLOGY=2x4 TPU_CHIPS_PER_HOST_BOUNDS=2,4,1 "
        "TPU_HOST_BOUNDS=1,1,1): this host is another TPU; set vm.accelerator in jobs/pipeline.yaml (or the "
        f"stack's tpu-rl:machineType) to what it is ({error})"
    )


def test_the_cpu_tier_expects_jax_on_cpu():
    cpu = Expected(0, V6E, {})
    assert envcheck.problems(cpu, facts(platform="cpu", device_kinds=["cpu"])) == []
    assert envcheck.problems(cpu, facts()) == [
        "accelerator: JAX sees 8 tpu device(s) (TPU v6 lite), vm.accelerator expects CPU only"
    ]


def test_a_missing_package_names_the_pin_it_should_have():
    found = envcheck.problems(ON_THE_VM, facts(installed={**facts().installed, "vllm": None}))
    assert found == [
        f"vllm: not installed, the spec installs vllm @ git+{VLLM_REPO}@{VLLM_COMMIT} "
        "(MaxText 0.2.3's post_train_github_deps.txt)"
    ]


@pytest.mark.parametrize(
    ("installed", "says"),
    [
        (Installed("0.11.0"), "vllm: 0.11.0 (from an index) installed, the spec installs vllm @ git+"),
        (
            Installed("0.1.dev1", {"url": VLLM_REPO, "vcs_info": {"vcs": "git", "commit_id": "d626108b18"}}),
            f"vllm: 0.1.dev1 from git+{VLLM_REPO}@d626108b18 installed, the spec installs vllm @ git+{VLLM_REPO}@2131b",
        ),
    ],
)
def test_a_package_from_elsewhere_is_a_version_mismatch(installed, says):
    found = envcheck.problems(ON_THE_VM, facts(installed={**facts().installed, "vllm": installed}))
    assert len(found) == 1 and found[0].startswith(says), found


def test_a_pinned_version_is_compared_and_a_broken_import_named():
    cpu = Expected(0, V6E, {"google-tunix": "==0.1.7"})
    cpu_facts = {"platform": "cpu", "device_kinds": ["cpu"]}
    assert envcheck.problems(cpu, facts(**cpu_facts, installed={"google-tunix": Installed("0.1.5")})) == [
        "google-tunix: 0.1.5 installed, the spec installs google-tunix==0.1.7"
    ]
    broken = Installed("0.1.7", import_error="import tunix: ModuleNotFoundError: No module named 'grain'")
    assert envcheck.problems(cpu, facts(**cpu_facts, installed={"google-tunix": broken})) == [
        "google-tunix 0.1.7: does not import: import tunix: ModuleNotFoundError: No module named 'grain'"
    ]


def test_only_the_accepted_conflicts_pass():
    other = "The package `vllm` requires `torch==2.9.0`, but `2.11.0+cpu` is installed"
    accepting = Expected(8, V6E, {}, {UV_LINE: "MaxText requires numba>=0.65.1"})
    assert envcheck.problems(accepting, facts(conflicts=[UV_LINE, other])) == [
        f"uv pip check: {other} (not among environment.accepted_conflicts)"
    ]
    assert envcheck.summary(accepting, facts(conflicts=[UV_LINE])).endswith("1 accepted conflict(s)")


def test_a_star_accepts_any_text_of_that_package_alone():
    """The shipped list accepts whatever the three packages MaxText installs from its pinned commits declare
    (their pins differ by version, and vLLM's could not be read), and still nothing of any other package."""
    shipped_plan = build(load.read(REPO / "jobs"), [], "run-1")
    shipped = expected_environment(shipped_plan.spec, shipped_plan.accelerator)
    vllm = "The package `vllm` requires `tpu-inference==0.11.1`, but `0.0.0` is installed"
    jax = "The package `maxtext` requires `jax>=0.8.1`, but `0.7.0` is installed"
    assert envcheck.conflict_problems(shipped, facts(conflicts=[vllm, jax])) == [
        f"uv pip check: {jax} (not among environment.accepted_conflicts)"
    ]
    assert envcheck.summary(shipped, facts(conflicts=[vllm])).endswith("1 accepted conflict(s)")


def test_uv_s_own_report_is_read_line_by_line(monkeypatch):
    """uv 0.13's words, as it printed them for a venv with a missing dependency."""
    out = f"Checked 300 packages in 29ms\nFound 1 incompatibility\n{UV_LINE}\n"
    monkeypatch.setattr(envcheck, "_uv", lambda: ["uv"])
    monkeypatch.setattr(envcheck.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, out, ""))
    assert envcheck._conflicts() == ([UV_LINE], None)
    monkeypatch.setattr(envcheck, "_uv", lambda: None)
    assert envcheck._conflicts()[1].startswith("no uv in ")


def test_the_plan_expects_what_pipeline_yaml_says():
    plan = build(load.read(REPO / "jobs"), [], "run-1")
    expected = expected_environment(plan.spec, plan.accelerator)
    assert (expected.chips, expected.chip_kind) == (8, V6E)
    assert set(expected.packages) == {"google-tunix", "tpu-inference", "vllm"}
    assert all(why for why in expected.accepted.values())
    validate = plan.job("validate")
    argv = list(validate.runner_spec["argv"])
    assert Expected.from_json(argv[argv.index("--environment") + 1]) == expected
    assert validate.runner_spec["env"]["TPU_TOPOLOGY"] == "2x4"  # JAX finds the chips as train will
    assert not any(k.startswith("TPU_RL_") for k in validate.runner_spec["env"])  # nothing run-specific
    assert "validate" in plan.job("train").needs  # it ends before train starts


# --- the real check, in a Python given fake installs ----------------------------------------------


def _dist(site: Path, name: str, version: str, files: dict[str, str], direct_url: dict | None = None) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for path, text in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    (info / "RECORD").write_text("".join(f"{path},,\n" for path in files))
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


@pytest.fixture
def site(tmp_path) -> Path:
    """A v6e-8 as far as the check can tell: a fake jax with 8 v6e chips, MaxText's pins, tunix from its pin."""
    site = tmp_path / "site"
    site.mkdir()
    jax = "class D:\n    device_kind = 'TPU v6 lite'\n\ndef devices():\n    return [D()] * 8\n\ndef default_backend():\n    return 'tpu'\n"
    _dist(site, "jax", "0.10.1", {"jax/__init__.py": jax})
    _dist(site, "maxtext", "0.2.3", {envcheck.MAXTEXT_PINS: f"google-tunix @ {TUNIX}\n"})
    _dist(site, "google-tunix", "0.1.7", {"tunix/__init__.py": "import sys\nprint('tunix noise')\n"}, {"url": TUNIX})
    return site


def run_check(site: Path, expected: Expected, tmp_path: Path) -> subprocess.CompletedProcess:
    marker = tmp_path / "accepted"
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, CHECK, "--marker", marker, "--environment", expected.to_json()]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def test_the_real_check_passes_and_marks_a_good_environment(site, tmp_path):
    result = run_check(site, Expected(8, V6E, {"google-tunix": "maxtext"}), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("environment: ok: JAX sees 8 tpu device(s); google-tunix 0.1.7; uv pip check")
    assert "tunix noise" not in result.stdout  # what the imports print is kept out of the job's log
    assert (tmp_path / "accepted").read_text() == "0 jobs accepted, the environment proven\n"


@pytest.mark.parametrize(
    ("expected", "line"),
    [
        (
            Expected(4, V6E, {"google-tunix": "maxtext"}),
            "ENVIRONMENT ERROR: accelerator: JAX sees 8 tpu device(s) (TPU v6 lite), vm.accelerator expects 4 tpu devices",
        ),
        (
            Expected(8, V6E, {"tpu-inference": "==0.0.0"}),
            "ENVIRONMENT ERROR: tpu-inference: not installed, the spec installs tpu-inference==0.0.0",
        ),
        (
            Expected(8, V6E, {"google-tunix": "==0.1.5"}),
            "ENVIRONMENT ERROR: google-tunix: 0.1.7 installed, the spec installs google-tunix==0.1.5",
        ),
    ],
    ids=["device-count", "missing-package", "version-mismatch"],
)
def test_each_failure_is_one_line_and_leaves_no_marker(site, tmp_path, expected, line):
    result = run_check(site, expected, tmp_path)
    assert result.returncode == 2
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), result.stdout
    assert not (tmp_path / "accepted").exists()
