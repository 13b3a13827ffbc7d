"""The schema of jobs/*.yaml: what a user may write, checked before anything runs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
    command: list[str] | None = None  # an argv, for jobs that are not MaxText modules (prefetch)
    after: list[list[str]] = []  # argvs run after the job succeeded, in its environment
    needs: list[str] = []
    secrets: list[str] = []
    env: dict[str, str] = {}
    args: dict[str, str] = {}
    flags: dict[str, str] = {}  # module-only flags, passed as --name=value
    inputs: list[str] = []
    outputs: list[str] = Field(min_length=1)  # globs; all must match for the job to count as done
    progress: ProgressSpec | None = None

    @model_validator(mode="after")
    def _module_or_command(self) -> JobSpec:
        if (self.module is None) == (self.command is None):
            raise ValueError("give exactly one of module (a MaxText entry point) or command (an argv)")
        if self.command is not None and not self.command:
            raise ValueError("command is empty")
        if self.command is not None and (self.args or self.flags):
            raise ValueError("args and flags are for MaxText modules; put a command's arguments in command")
        return self


class EnvironmentSpec(Strict):
    """The Python environment `fab setup` builds; its hash is the setup stamp."""

    python: str = "3.12"
    venv: str = "maxtext_venv"
    packages: list[str] = Field(min_length=1)
    install_options: list[str] = []
    install_env: dict[str, str] = {}
    post_install: list[str] = []  # shell commands run inside the activated venv

    @property
    def venv_path(self) -> str:
        """The venv as the VM sees it: relative names live in the SSH user's home."""
        return self.venv if self.venv.startswith(("/", "~")) else f"~/{self.venv}"

    @property
    def python_path(self) -> str:
        return f"{self.venv_path}/bin/python3"


class VmSpec(Strict):
    """Where state lives on the VM and what the VM must offer before a job starts."""

    state_dir: str = "tpu-rl"
    startup_marker: str = "/var/lib/tpu-rl/startup.done"
    startup_log: str = "/var/log/tpu-rl-startup.log"
    chips: int = Field(8, ge=0)
    chip_glob: str = "/dev/vfio/[0-9]*"
    min_memory_gb: float = Field(0, ge=0)
    min_shm_gb: float = Field(0, ge=0)
    shm_path: str = "/dev/shm"
    validate_args: bool = True


class ResultsSpec(Strict):
    """Durable copies of the export: the Hugging Face Hub and/or the stack's bucket."""

    hub_repo: str = ""  # e.g. you/llama3.1-8b-instruct-grpo
    hub_private: bool = True
    gcs: str = Field("", pattern=r"^(|stack|gs://.+)$")  # "stack": the Pulumi stack's bucket


class PipelineSpec(Strict):
    jobs: list[str] = Field(min_length=1)
    vars: dict[str, str] = {}
    environment: EnvironmentSpec
    vm: VmSpec = VmSpec()
    results: ResultsSpec = ResultsSpec()
