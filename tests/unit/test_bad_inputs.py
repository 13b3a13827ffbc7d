"""Every bad input, through the real `fab`: one short error naming the file or option, exit 2, no traceback.

Each case runs `fab train` against a listening socket that stands for both the VM and
the Hugging Face Hub, so a case that got as far as contacting anything is seen. CPU
time and peak memory are bounded (the process also runs under an address-space limit,
so an input that blows up memory fails the case instead of the machine). Each case's
fab is forked from tests/fabfork.py's server: its CPU and memory are the child's plus
the server's imports (its code in memory), which every fab has first; one case starts
fab whole, the kernel counting all.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from bootstrap.jobs import checked
from bootstrap.paths import REPO
from tests import fabfork

CPU_SECONDS = 2.0
MAX_RSS_MB = 400
ADDRESS_SPACE = 4 << 30


@dataclass(frozen=True)
class Case:
    """A change to jobs/ (file -> function of its bytes), extra fab arguments, and the expected message."""

    name: str
    expect: str
    file: str = ""
    change: Callable[[bytes], bytes] = lambda b: b
    args: tuple[str, ...] = ()
    task: str = "train"

    def __str__(self) -> str:
        return self.name


def put(key: str, value: str) -> Callable[[bytes], bytes]:
    """Append `key: value` under a top-level section of the file (or at the top level)."""

    def change(text: bytes) -> bytes:
        section, _, leaf = key.rpartition(".")
        line = f"{leaf}: {value}\n".encode()
        if not section:
            return text + line
        marker = f"\n{section}:\n".encode()
        assert marker in text, f"no section {section}"
        head, tail = text.split(marker, 1)
        lines = tail.split(b"\n")
        kept = [ln for ln in lines if not ln.startswith(f"  {leaf}:".encode())]
        return head + marker + b"  " + line + b"\n".join(kept)

    return change


def replace(old: str, new: str | bytes) -> Callable[[bytes], bytes]:
    def change(text: bytes) -> bytes:
        assert old.encode() in text, old
        return text.replace(old.encode(), new if isinstance(new, bytes) else new.encode(), 1)

    return change


BOMB = "bomb:\n" + "".join(f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else 'x'}]\n" for i in range(10))
YAML_CASES = [
    Case(  # the first anchor is on the second line of the bomb, after the file's own lines
        "alias bomb",
        f"pipeline.yaml:{(REPO / 'jobs' / 'pipeline.yaml').read_text().count(chr(10)) + 2}: yaml: anchors and aliases",
        "pipeline.yaml",
        lambda b: b + BOMB.encode(),
    ),
    Case("recursive alias", "train.yaml:", "train.yaml", lambda b: b + b"loop: &loop [*loop]\n"),
    Case("deep nesting", "nested deeper than 8", "pipeline.yaml", lambda b: b + b"deep: " + b"[" * 5000 + b"]" * 5000),
    Case(
        "deep block nesting",
        "nested deeper than 8",
        "train.yaml",
        put("args.x", "{a: {b: {c: {d: {e: {f: {g: {}}}}}}}}"),
    ),
    Case("complex key", "train.yaml:", "train.yaml", lambda b: b + b"? [a, b]\n: c\n"),
    Case(
        "invalid UTF-8", "convert.yaml:2: yaml: not UTF-8 (byte 0xff)", "convert.yaml", replace("module", b"\xffmodule")
    ),
    Case("raw NUL byte", "export.yaml:1: yaml: contains a NUL byte", "export.yaml", lambda b: b"\x00" + b),
    Case(
        "escaped NUL in env",
        "train.yaml:13: env.HF_HOME: contains a control character",
        "train.yaml",
        put("env.HF_HOME", '"a\\0b"'),
    ),
    Case(
        "ESC in a value", "args.run_name: contains a control character", "train.yaml", put("args.run_name", '"\\e[2J"')
    ),
    Case(
        "C1 control in a value",
        "args.run_name: contains a control character",
        "train.yaml",
        put("args.run_name", '"\\x9b2J"'),
    ),
    Case(
        "control sequence in a key",  # an OSC title and a screen clear: refused without echoing the key
        "yaml: a key holds a control character",
        "train.yaml",
        lambda b: b + b'"x\\e]0;pwned\\a\\e[2Jy": 1\n',
    ),
    Case(
        "duplicate key",
        "convert.yaml:4: needs: duplicate key",
        "convert.yaml",
        replace("secrets:", "needs: [x]\nsecrets:"),
    ),
    Case("huge file", "bytes; a job file is at most", "train.yaml", lambda b: b + b"#" * 300_000 + b"\n"),
    Case("not YAML", "train.yaml:", "train.yaml", lambda b: b + b"args: [unclosed\n"),
    Case("a list, not a mapping", "must be a mapping", "export.yaml", lambda b: b"- a\n- b\n"),
    Case("chips 1e400", "vm.chips:", "pipeline.yaml", put("vm.chips", "1e400")),
    Case(
        "chips huge", "vm.chips: Input should be less than or equal to 256", "pipeline.yaml", put("vm.chips", "9" * 40)
    ),
    Case(
        "chips negative", "vm.chips: Input should be greater than or equal to 1", "pipeline.yaml", put("vm.chips", "-1")
    ),
    Case("chips hex", "vm.chips:", "pipeline.yaml", put("vm.chips", "0x10")),
    Case(
        "memory inf",
        "vm.min_memory_gb: Input should be a finite number",
        "pipeline.yaml",
        put("vm.min_memory_gb", "inf"),
    ),
    Case(
        "memory nan",
        "vm.min_memory_gb: Input should be a finite number",
        "pipeline.yaml",
        put("vm.min_memory_gb", "nan"),
    ),
    Case("memory 1e400", "vm.min_memory_gb:", "pipeline.yaml", put("vm.min_memory_gb", "1e400")),
    Case(
        "total steps huge",
        "progress.total_steps: '",
        "train.yaml",
        replace("total_steps: ${train_steps}", "total_steps: " + "9" * 5000),
    ),
    Case(
        "total steps not ASCII",
        "progress.total_steps: '٣' is not a whole number below",
        "train.yaml",
        replace("total_steps: ${train_steps}", "total_steps: ٣"),
    ),
    Case("hub repo a/b/c", "results.hub_repo:", "pipeline.yaml", put("results.hub_repo", "a/b/c")),
    Case("hub repo bad name", "results.hub_repo:", "pipeline.yaml", put("results.hub_repo", "me/bad--name..")),
    Case(
        "hub repo no namespace",
        "results.hub_repo: 'model' must be NAMESPACE/NAME",
        "pipeline.yaml",
        put("results.hub_repo", "model"),
    ),
    Case("gcs not gs://", "results.gcs:", "pipeline.yaml", put("results.gcs", "s3://bucket")),
    Case(
        "wandb project with a space",
        "results.wandb: 'my project' is not",
        "pipeline.yaml",
        put("results.wandb", "my project"),
    ),
    Case(
        "mlflow not a URL",
        "results.mlflow: 'localhost:5000' is not",
        "pipeline.yaml",
        put("results.mlflow", "localhost:5000"),
    ),
    Case(
        "mlflow password in its URL",
        "without a user or password in it",
        "pipeline.yaml",
        put("results.mlflow", "http://me:pw@h:5000"),
    ),
    Case("gcs empty bucket", "results.gcs:", "pipeline.yaml", put("results.gcs", "gs://")),
    Case(
        "health stop below its warning",
        "health: agreement_stop 1.01 is below agreement_warn 1.05",
        "pipeline.yaml",
        lambda b: b + b"health:\n  agreement_stop: 1.01\n",
    ),
    Case("health kl nan", "health.kl_max:", "pipeline.yaml", lambda b: b + b"health:\n  kl_max: .nan\n"),
    Case("health unknown rule", "health.loss_max:", "pipeline.yaml", lambda b: b + b"health:\n  loss_max: 3\n"),
    Case("empty state_dir", "vm.state_dir: '' is not a plain folder", "pipeline.yaml", put("vm.state_dir", '""')),
    Case(
        "state_dir ..", "vm.state_dir: '../etc' is not a plain folder", "pipeline.yaml", put("vm.state_dir", "../etc")
    ),
    Case("state_dir root", "vm.state_dir: '/' is not a plain folder", "pipeline.yaml", put("vm.state_dir", "/")),
    Case(
        "state_dir in ~",  # the shell would make $HOME/~/x while SFTP writes $HOME/x
        "vm.state_dir: '~/x': a relative folder is already in the SSH user's home; write 'x'",
        "pipeline.yaml",
        put("vm.state_dir", "~/x"),
    ),
    Case("state_dir shell", "vm.state_dir:", "pipeline.yaml", put("vm.state_dir", '"$(touch /tmp/x)"')),
    Case("venv shell", "environment.venv:", "pipeline.yaml", put("environment.venv", '"a b;rm -rf ~"')),
    Case("python version", "environment.python:", "pipeline.yaml", put("environment.python", '"3.12; id"')),
    Case(
        "install_env key",
        "environment.install_env.A;id:",
        "pipeline.yaml",
        replace("UV_TORCH_BACKEND: cpu", '"A;id": cpu'),
    ),
    Case("env name", "env.1BAD:", "train.yaml", put("env.1BAD", "x")),
    Case("secret name", "secrets.0:", "train.yaml", replace("secrets: [HF_TOKEN]", "secrets: [HF TOKEN]")),
    Case("job name escapes jobs/", "jobs.0:", "pipeline.yaml", replace("prefetch,", "../prefetch,")),
    Case(
        "vars not a mapping",
        "vars: Input should be a valid dictionary",
        "pipeline.yaml",
        replace("vars:", "vars: [a]\nold_vars:"),
    ),
    Case("empty pipeline", "jobs: Field required", "pipeline.yaml", lambda b: b""),
]
ARG_CASES = [
    Case("no value", "--arg train: --arg: expected JOB.KEY=VALUE", args=("--arg", "train")),
    Case("empty job", "--arg =1: --arg: expected JOB.KEY=VALUE", args=("--arg", "=1")),
    Case("empty key", "--arg train.=1: --arg: expected JOB.KEY=VALUE", args=("--arg", "train.=1")),
    Case(
        "control character",
        "--arg 'train.run_name=\\x1b[2J': --arg: contains a control character",
        args=("--arg", "train.run_name=\x1b[2J"),
    ),
    Case("huge integer", "args.num_batches:", args=("--arg", "train.num_batches=" + "9" * 5000)),
    Case(
        "float for an integer", "args.num_batches: '1e999' is not an integer", args=("--arg", "train.num_batches=1e999")
    ),
    Case("bad env name", "env.1BAD:", args=("--arg", "train.env.1BAD=x")),
    Case("unknown job", "bogus: no such job", args=("--arg", "bogus.x=1")),
    Case("vars without name", "--arg vars.=1: --arg: expected JOB.KEY=VALUE", args=("--arg", "vars.=1")),
]
NUMBER_CASES = [  # an option's number that is no number, or out of its range (--every takes fractions: below)
    Case("probe a fraction", "--probe '2.5': a whole number of at least 0", args=("--probe", "2.5")),
    Case("probe text", "--probe 'ten': a whole number of at least 0", args=("--probe", "ten")),
    Case("tries zero", "--tries '0': a whole number of at least 1", args=("--watch", "--tries", "0")),
    Case("tries a fraction", "--tries '1.5': a whole number", args=("--watch", "--tries", "1.5")),
    Case("every zero", "--every '0': a number from 0.1 to 86400", args=("--every", "0"), task="tensorboard"),
    Case("every nan", "--every 'nan': a number from 0.1", args=("--every", "nan"), task="tensorboard"),
    Case("every text", "--every 'soon': a number", args=("--every", "soon"), task="tensorboard"),
    Case(
        "port a fraction", "--port '80.5': a whole number from 0 to 65535", args=("--port", "80.5"), task="tensorboard"
    ),
    Case("port too high", "--port '65536': a whole number from 0", args=("--port", "65536"), task="tensorboard"),
]
RUN_NAME_CASES = [
    Case(f"run name {name!r}", "--run-name:", args=("--run-name", name))
    for name in ("../x", "a/b", "-x", "x" * 65, " ", "a\x1bb", "a..b", "")
]


@pytest.fixture(scope="module")
def listener():
    """A socket that accepts nothing: any connection fab makes to the VM or the Hub is counted."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        yield sock


def contacted(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
    except BlockingIOError:
        return False
    return True


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def fab_train(
    tmp_path: Path, listener: socket.socket, case: Case, *options: str, whole: bool = False
) -> tuple[int, str, str, tuple[float, int]]:
    """`fab train` with the case's jobs/ and arguments, the VM and the Hub both at `listener`, forked (or started
    `whole`): its exit code, output, error, CPU-s and peak resident KiB. Killed after 60 s."""
    jobs = tmp_path / "jobs"
    if not jobs.exists():
        shutil.copytree(REPO / "jobs", jobs)
    if case.file:
        path = jobs / case.file
        path.write_bytes(case.change(path.read_bytes()))
    port = listener.getsockname()[1]
    command = [fabfork.FAB, "-r", str(REPO), "-H", f"127.0.0.1:{port}", *options, case.task, *case.args]
    if not whole:
        env, forks = fab_env(tmp_path, port), fabfork.forks()
        done = fabfork.run(command, env=env, capture_output=True, text=True, timeout=60, address_space=ADDRESS_SPACE)
        assert fabfork.forks() == forks + 1, "fab was started anew, not forked: its CPU would be counted twice"
        (cpu, rss), (start_cpu, start_files) = done.usage, fabfork.start_usage()
        return done.returncode, done.stdout, done.stderr, (start_cpu + cpu, start_files + rss)
    with open(tmp_path / "out", "w+") as out, open(tmp_path / "err", "w+") as err:
        process = subprocess.Popen(
            command, env=fab_env(tmp_path, port), stdout=out, stderr=err, preexec_fn=limit_memory
        )
        timer = threading.Timer(60, process.kill)
        timer.start()
        _, status, usage = os.wait4(process.pid, 0)
        timer.cancel()
        out.seek(0), err.seek(0)
        return (
            os.waitstatus_to_exitcode(status),
            out.read(),
            err.read(),
            (usage.ru_utime + usage.ru_stime, usage.ru_maxrss),
        )


def fab_env(tmp_path: Path, port: int) -> dict[str, str]:
    return {
        **os.environ,
        "TPU_RL_JOBS": str(tmp_path / "jobs"),
        "TPU_RL_RUNS": str(tmp_path / "runs"),
        "HF_TOKEN": "hf_" + "x" * 34,
        "HF_ENDPOINT": f"http://127.0.0.1:{port}",
        "HOME": str(tmp_path),
    }


def one_clean_error(returncode: int, stdout: str, stderr: str, expect: str) -> None:
    assert returncode == 2, (stdout, stderr)
    assert expect in stderr, stderr
    assert "Traceback" not in stdout + stderr
    assert not re.search(r"[\x1b\x07\x9b]", stderr), "a control character reached the terminal"
    lines = stderr.strip().splitlines()
    assert all(line.startswith("error: ") for line in lines) and len(lines) <= 3, stderr


def refused_in_bounds(tmp_path: Path, listener: socket.socket, case: Case, whole: bool = False) -> None:
    """One clean error, nothing contacted, within the CPU and memory bounds."""
    returncode, stdout, stderr, (cpu, rss) = fab_train(tmp_path, listener, case, whole=whole)
    one_clean_error(returncode, stdout, stderr, case.expect)
    assert not contacted(listener), "contacted the VM or the Hub before refusing"
    assert cpu < CPU_SECONDS
    assert rss < MAX_RSS_MB * 1024


@pytest.mark.parametrize("case", YAML_CASES + ARG_CASES + NUMBER_CASES + RUN_NAME_CASES, ids=str)
def test_bad_input_is_one_clean_error(case: Case, tmp_path, listener):
    refused_in_bounds(tmp_path, listener, case)


def test_a_refusal_by_a_fab_started_whole_stays_within_the_same_bounds(tmp_path, listener):
    """The bounds above, with fab started whole: its interpreter, its imports and the refusal, counted by the kernel."""
    refused_in_bounds(tmp_path, listener, YAML_CASES[0], whole=True)


def test_inputs_remembered_as_passed_dial_at_once_yet_a_failed_check_comes_first_and_waits_for_nothing(
    tmp_path, listener, monkeypatch
):
    """The memo of inputs that passed (jobs/checked.py) only starts the dial early: were it ever wrong, the
    check's error still comes first, and fab does not wait for a VM that answers nothing (a 100 s timeout
    here; it is killed at 60 s)."""
    case = next(c for c in ARG_CASES if c.name == "unknown job")
    shutil.copytree(REPO / "jobs", tmp_path / "jobs")
    for name, value in fab_env(tmp_path, listener.getsockname()[1]).items():
        monkeypatch.setenv(name, value)
    as_train_opens_its_session = {"new_run": False, "recover": False, "reads_states": True}  # tasks/pipeline_tasks.py
    checked.LocalInputs(list(case.args[1::2]), None, as_train_opens_its_session).passed()  # forged: it never passed
    returncode, stdout, stderr, _ = fab_train(tmp_path, listener, case, "-t", "100")
    one_clean_error(returncode, stdout, stderr, case.expect)
    assert contacted(listener), "the remembered inputs did not dial the VM early"
