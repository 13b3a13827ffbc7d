"""The schema of jobs/*.yaml: what a user may write, checked before anything runs."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

# Each pattern a value must match, and what it means in words: an error names the words, never the pattern.
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
JOB_NAME = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
PACKAGE = r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?$"
EXPECTED = r"^(maxtext|==[A-Za-z0-9.+!_-]{1,64})$"
CONFLICT = r"^The package `"
PYTHON = r"^3\.[0-9]{1,2}(\.[0-9]{1,2})?$"
ACCELERATOR = r"^(auto|host|cpu|v6e-(1|4|8))$"
AUTOSTOP = r"^(auto|off|[1-9][0-9]{0,3}[smh])$"
GCS = r"^(|stack|gs://[a-z0-9][a-z0-9._-]{1,221}[a-z0-9](/[^\s]*)?)$"
NOTIFY = r"^[A-Za-z_][A-Za-z0-9_]{0,63}(:(json|slack|discord|ntfy))?$"
WANDB = r"^([A-Za-z0-9][A-Za-z0-9._-]{0,127})?$"
MLFLOW = r"^(https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/\S*)?)?$"
IMAGE = r"^([a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})?)?$"
PATTERN_WORDS = {
    ENV_NAME: "an environment variable's name: letters, digits and _, not starting with a digit",
    JOB_NAME: "a job name: letters, digits, _ and -, starting with a letter",
    PACKAGE: "a package's name as PyPI spells it (google-tunix)",
    EXPECTED: "maxtext (MaxText's own pin) or ==VERSION",
    CONFLICT: "a line of `uv pip check` as it prints it (The package `...` requires ...)",
    PYTHON: "a Python version such as 3.12",
    ACCELERATOR: "auto, host, cpu, v6e-1, v6e-4 or v6e-8",
    AUTOSTOP: "auto, off, or a time such as 30m or 2h (s, m or h, up to 4 digits)",
    GCS: "empty (no bucket copy), stack (the Pulumi stack's results bucket) or gs://BUCKET/PREFIX (BUCKET: 3 to 63 "
    "lower-case letters, digits, -, _ and .)",
    NOTIFY: "NAME or NAME:KIND: an environment variable's name, KIND one of json, slack, discord, ntfy",
    WANDB: "empty (off) or a W&B project's name: letters, digits, ., _ and -",
    MLFLOW: "empty (off) or an MLflow tracking server's http(s) URL, such as http://127.0.0.1:5000, without a user or "
    "password in it (those go in MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)",
    IMAGE: "an image reference such as us-docker.pkg.dev/PROJECT/REPO/NAME:TAG",
}

# Names that reach a shell or an environment: checked here so that nothing odd is ever quoted wrong.
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME)]
JobName = Annotated[str, StringConstraints(pattern=JOB_NAME)]
SAFE_PATH = re.compile(r"(~/|/)?[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*/?")


def _folder(value: str) -> str:
    if not SAFE_PATH.fullmatch(value) or ".." in value.split("/"):
        raise ValueError(
            f"{value!r} is not a plain folder: use letters, digits and . _ + - in names, "
            "relative to the SSH user's home (or absolute), without .."
        )
    return value


# A folder: relative to the SSH user's home, or absolute; no `..`, nothing a shell would expand.
Folder = Annotated[str, AfterValidator(_folder)]
Gigabytes = Annotated[float, Field(ge=0, le=1_000_000, allow_inf_nan=False)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProgressSpec(Strict):
    """How far training is: steps come from the trainer's `Train step N` lines; metrics from TensorBoard."""

    tensorboard_dir: str
    total_steps: str  # may be a ${variable}; an integer once resolved


class JobSpec(Strict):
    """One job: a MaxText `module` with its arguments, or a plain `command`; what it reads and produces."""

    description: str = ""
    module: str | None = None
    launcher: str | None = None  # a script that runs the module in place of `python -m` (maxtext_run.py)
    command: list[str] | None = None  # an argv, for jobs that are not MaxText modules (prefetch)
    after: list[list[str]] = []  # argvs run after the job succeeded, in its environment
    needs: list[JobName] = []
    secrets: list[EnvName] = []
    env: dict[EnvName, str] = {}
    args: dict[str, str] = {}
    flags: dict[str, str] = {}  # module-only flags, passed as --name=value
    inputs: list[str] = []
    outputs: list[str] = Field(min_length=1)  # globs; all must match for the job to count as done
    progress: ProgressSpec | None = None
    tpu: bool = False  # runs on the TPU: fab gives it libtpu's TPU_ variables for vm.accelerator's slice

    @model_validator(mode="after")
    def _module_or_command(self) -> JobSpec:
        if (self.module is None) == (self.command is None):
            raise ValueError("give exactly one of module (a MaxText entry point) or command (an argv)")
        if self.command is not None and not self.command:
            raise ValueError("command is empty")
        if self.command is not None and (self.args or self.flags or self.launcher):
            raise ValueError("args, flags and launcher are for MaxText modules; put a command's arguments in command")
        return self


# A distribution's name as PyPI spells it (google-tunix, tpu-inference).
PackageName = Annotated[str, StringConstraints(pattern=PACKAGE)]
# Where a checked package's version comes from: MaxText's own pin (remote/envcheck.py MAXTEXT_PINS), or ==VERSION.
ExpectedVersion = Annotated[str, StringConstraints(pattern=EXPECTED)]
ROLLOUT_PACKAGES = {"google-tunix": "maxtext", "tpu-inference": "maxtext", "vllm": "maxtext"}


class AcceptedConflict(Strict):
    """One line of `uv pip check` that the environment's own install is known to leave, and why it is harmless."""

    conflict: str = Field(min_length=1, pattern=CONFLICT)
    why: str = Field(min_length=1)


class EnvironmentSpec(Strict):
    """The Python environment `fab setup` builds; its hash (of what is built, not what is checked) is the stamp."""

    python: str = Field("3.12", pattern=PYTHON)
    venv: Folder = "maxtext_venv"
    packages: list[Annotated[str, StringConstraints(min_length=1)]] = Field(min_length=1)
    install_options: list[str] = []
    install_env: dict[EnvName, str] = {}
    post_install: list[str] = []  # shell commands run inside the activated venv
    # What the validate job proves in the built venv before train (remote/envcheck.py): each package imports, at
    # the version it is installed at: "maxtext" (MaxText's post_train_github_deps.txt pin) or "==VERSION".
    check_packages: dict[PackageName, ExpectedVersion] = dict(ROLLOUT_PACKAGES)
    # `uv pip check` lines the install above is known to leave; any other conflict fails the check.
    accepted_conflicts: list[AcceptedConflict] = []

    @property
    def venv_path(self) -> str:
        """The venv as the VM sees it: relative names live in the SSH user's home."""
        return self.venv if self.venv.startswith(("/", "~")) else f"~/{self.venv}"

    @property
    def python_path(self) -> str:
        return f"{self.venv_path}/bin/python3"


class VmSpec(Strict):
    """Where state lives on the VM and what the VM must offer before a job starts."""

    state_dir: Folder = "tpu-rl"
    startup_marker: Folder = "/var/lib/tpu-rl/startup.done"
    startup_log: Folder = "/var/log/tpu-rl-startup.log"
    # What the jobs run on, one setting (jobs/accelerator.py): auto (the stack's tpu-rl:machineType), v6e-1, v6e-4,
    # v6e-8, host (a -H host's own TPU environment: then chips and chip_kind say what JAX must see), or cpu (no TPU).
    accelerator: str = Field("auto", pattern=ACCELERATOR)
    chips: int | None = Field(None, ge=1, le=256)  # with accelerator: host, the chips JAX must see
    chip_kind: str | None = Field(None, min_length=1, max_length=64)  # with host, their device_kind ("TPU v5 lite")
    chip_glob: str = "/dev/vfio/[0-9]*"
    min_memory_gb: Gigabytes = 0
    min_shm_gb: Gigabytes = 0
    shm_path: Folder = "/dev/shm"
    validate_args: bool = True
    check_environment: bool = True  # the environment proven beside the validator (remote/envcheck.py)
    # Shut the VM down once every job is done and no fab command came for this long: "auto" (by the
    # stack's provisioning model, docs/recovery.md: Autostop), "off", or a time such as 30m, 2h.
    autostop: str = Field("auto", pattern=AUTOSTOP)
    # What a chip-hour costs you, for fab plan's estimate; unset: the list price of the stack's provisioning model
    # where one is known (results/estimate.py), else no cost is shown
    price_per_chip_hour: Annotated[float, Field(ge=0, le=10_000, allow_inf_nan=False)] | None = None
    autostop_command: list[Annotated[str, StringConstraints(min_length=1)]] = Field(
        ["sudo", "-n", "shutdown", "-h", "now"], min_length=1
    )

    @field_validator("state_dir")
    @classmethod
    def _in_home_or_absolute(cls, value: str) -> str:
        if value.startswith("~"):  # the shell and SFTP would read it as two different folders
            raise ValueError(f"{value!r}: a relative folder is already in the SSH user's home; write {value[2:]!r}")
        return value


class ResultsSpec(Strict):
    """Durable copies of the export: the Hugging Face Hub and/or the stack's bucket."""

    hub_repo: str = ""  # e.g. you/llama3.1-8b-instruct-grpo
    hub_private: bool = True
    # "stack": the Pulumi stack's bucket (tpu-rl:resultsBucket), or gs://BUCKET/PREFIX
    gcs: str = Field("", pattern=GCS)
    # When the Hub copy is made (remote/evals.py gate): "improved" (after training above before by more than the
    # noise of that many problems), "always", or the lowest GSM8K accuracy in % after training
    publish_if: Literal["improved", "always"] | Annotated[float, Field(ge=0, le=100)] = "improved"
    # Who hears when the pipeline ends or needs you: each an environment variable on this machine that holds a
    # webhook URL (a secret: fab puts it on the VM as it puts the token), NAME or NAME:KIND (json, slack,
    # discord, ntfy; by default told by the URL's host)
    notify: list[Annotated[str, StringConstraints(pattern=NOTIFY)]] = []
    # Experiment trackers besides TensorBoard (docs/tracking.md): the W&B project train logs to, live, named
    # after the run (its key: WANDB_API_KEY here, a secret; without it W&B logs offline on the VM); the MLflow
    # tracking server fab logs the run to (its parameters, scalars, evals and result) at the run's end and with
    # fab metrics (its credentials: MLFLOW_TRACKING_TOKEN, or _USERNAME and _PASSWORD, here; they never leave it)
    wandb: str = Field("", pattern=WANDB)
    mlflow: str = Field("", pattern=MLFLOW)

    @field_validator("hub_repo")
    @classmethod
    def _hub_repo(cls, value: str) -> str:
        """Checked with huggingface_hub's own rules, so a bad name fails here and not after training."""
        if value:
            from huggingface_hub.errors import HFValidationError  # a third of a second to import: only when set
            from huggingface_hub.utils import validate_repo_id

            try:
                validate_repo_id(value)
            except HFValidationError as err:
                raise ValueError(str(err).split("\n")[0]) from None
            if value.count("/") != 1:
                raise ValueError(f"{value!r} must be NAMESPACE/NAME, e.g. you/llama3.1-8b-instruct-grpo")
        return value


class HealthSpec(Strict):
    """When train stops itself, its last committed checkpoint kept (remote/health.py); 0 turns a rule off."""

    smoke: bool = True  # the answers before training, through train's sampler: readable, not looping, ending
    smoke_right: int = Field(1, ge=0, le=1_000_000)  # of them, at least this many right (where the task says)
    reward_floor_steps: int = Field(20, ge=0, le=1_000_000)  # every completion at the lowest reward: steps in a row
    kl_max: float = Field(1.0, ge=0, le=1_000, allow_inf_nan=False)  # the KL's most, either sign
    length_steps: int = Field(10, ge=0, le=1_000_000)  # completions all empty, or all at the limit: steps in a row
    agreement_warn: float = Field(1.05, ge=1, le=100, allow_inf_nan=False)  # sampler-trainer agreement: a warning
    agreement_stop: float = Field(1.5, ge=1, le=100, allow_inf_nan=False)  # and a stop

    @model_validator(mode="after")
    def _ordered(self) -> HealthSpec:
        if self.agreement_stop < self.agreement_warn:
            raise ValueError(f"agreement_stop {self.agreement_stop:g} is below agreement_warn {self.agreement_warn:g}")
        return self


class GkeSpec(Strict):
    """The gke backend's container image: MaxText with the post-training dependencies."""

    image: str = Field("", pattern=IMAGE)


class PipelineSpec(Strict):
    jobs: list[JobName] = Field(min_length=1)
    # What GRPO learns (jobs/tasks/NAME.yaml, bootstrap/jobs/task.py): gsm8k, MaxText's own, or one of your own
    task: Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")] = "gsm8k"
    vars: dict[str, str] = {}
    environment: EnvironmentSpec
    vm: VmSpec = VmSpec()
    results: ResultsSpec = ResultsSpec()
    health: HealthSpec = HealthSpec()
    gke: GkeSpec = GkeSpec()
