"""The VM side of tpu-rl: the one module that owns the job protocol on the VM.

Copied to the VM and run with its system python3 (standard library only), so it works
before any environment exists. It owns the folder layout (Layout), the job states
(JobState) and the files of a job folder. The pipeline driver (driver.py, beside it)
launches jobs through its functions; a job's log is read through joblog.py; the laptop
imports it for the names and uses these subcommands:

    run JOB_DIR                   the detached runner itself (`launch` forks it, or starts it anew)
    status JOB_DIR...             JSON state of each job
    copy-down GS_URL DIR          copy a folder of the bucket to DIR (what is there at its size is kept)
    trusted FOLDER [JOB_DIR]      before fab reads FOLDER again: it is the SSH user's alone (folders.py), and
                                  JOB_DIR's job is done with its seals intact; prints the seals (JSON)

A job's command runs in its own session and process group, behind a small shell that
writes its exit code to a file: if the runner dies, the job goes on, and the next launch
re-attaches a new runner to it instead of starting a second copy. A job counts as done
only when it exited 0 and every declared output exists; `done` is written after that
check and never before, with the SHA-256 of each small output file (`seals`: an export's SHA256SUMS, which binds
its weights): a sealed file that differs later is not the job's (another account planted it after a restart
emptied /dev/shm, say), and the job is no longer done. A job done for `inputs` (files it read, such as an export's
SHA256SUMS) is done only while they are unchanged; while they are gone (a restart wiped /dev/shm) it
stays done: a verified copy of an export is the run's result, never made again from a new export. Outputs may live in Cloud Storage
(gs://, through gcs.py beside it): a job whose spec names a `record` there writes it once
its outputs were verified, and a new VM that finds the record (and the outputs, verified
again) takes the job as done instead of running it again.
"""

from __future__ import annotations

import enum
import errno
import glob
import hashlib
import json
import os
import re
import signal
import sys
import time

try:
    from . import faults, folders, gcs, processes  # on the laptop: bootstrap.remote
except ImportError:
    import faults  # on the VM: beside this script in the tools folder
    import folders
    import gcs
    import processes

DEFERRED = re.compile(r"\$\{(hostname|latest_step:([^{}]+))\}")
STOPPED_EXIT = 86  # a job's word that a health rule stopped it (health.py): the job is stopped
GO_ON_ENV = "TPU_RL_HEALTH_GO_ON"  # in a stopped job's environment: fab train --go-on, carry it on
SEAL_MAX_BYTES = (
    16 * 1024 * 1024
)  # an output file this small is sealed by its SHA-256 (an export's SHA256SUMS, a config)

# The files of a job folder.
SPEC = "spec.json"  # what to run (written by launch)
RUNNER = "runner.json"  # the runner's pid and start time
PROCESS = "process.json"  # the job's own process group: pid and start time
EXIT_CODE = "exit_code"  # written by the job's shell when its command ends
RESULT = "result.json"  # the runner's verdict: exit code, error
DONE = "done"  # written only after the outputs were verified
LOG = "log"
RUNNER_ERR = "runner.err"  # the runner's own stderr: shown when it fails to start
# A step's shell: waits for the runner's "go" (sent once the process is recorded), runs the command with no
# input, then keeps its exit code in the file named first.
GO_THEN_RUN = 'IFS= read -r go; [ "$go" = go ] || exit 0; exec </dev/null; "$@"; echo $? > "$0"'


class JobState(str, enum.Enum):
    """Where a job stands on the VM, as `status` reports it."""

    PENDING = "pending"
    """Never started in this folder."""
    RUNNING = "running"
    """Its runner or its process is alive."""
    DONE = "done"
    """Exited 0 and every declared output exists."""
    FAILED = "failed"
    """Ended with a non-zero exit code, or exited 0 without its outputs."""
    INTERRUPTED = "interrupted"
    """Started, but runner and process are gone without a verdict (VM restart, kill)."""
    LOST = "lost"
    """Was done, but its outputs have gone since (a restart wipes /dev/shm), or one it sealed differs since (not
    what it verified: made by someone else), or a Hub upload held back (results.publish_if) whose export has
    gone: the model then exists nowhere."""
    STALE = "stale"
    """Was done, but for inputs that have changed since (a copy of an export that was made again); inputs
    that are gone leave a copy done."""
    STOPPED = "stopped"
    """Ended by a health rule (remote/health.py: a NaN loss, a collapsed policy...), its exit code STOPPED_EXIT: not
    failed, not done; its last committed checkpoint kept, and not started again until fab train --go-on."""


class Layout:
    """Where everything lives on the VM, below the state folder (relative paths: the SSH user's home)."""

    def __init__(self, state_dir: str):
        self.root = state_dir.rstrip("/")
        self.bin = f"{self.root}/bin"
        self.secrets = f"{self.root}/secrets"
        self.lock = f"{self.root}/lock"  # held by the pipeline driver for as long as it runs
        self.current_run = f"{self.root}/current-run"
        self.pipeline = f"{self.root}/pipeline"  # the driver's plan, state and events (driver.py)
        self.runs = f"{self.root}/runs"  # a folder a run, its jobs' folders in it

    def setup(self, digest: str) -> str:
        """The environment build for one spec: the same spec again finds it done."""
        return f"{self.root}/setup/{digest}"

    def shared(self, job: str, key: str) -> str:
        """A job that renders the same for every run (convert): done once, used by all runs."""
        return f"{self.root}/shared/{job}-{key}"

    def run_job(self, run: str, job: str) -> str:
        return f"{self.runs}/{run}/{job}"

    def run_plan(self, run: str) -> str:
        """What the driver was handed for a run (its jobs, settings and durable copies, merged over the fab
        commands that drove it): `fab runs` reads a run's settings and copies there after the next plan came."""
        return f"{self.pipeline}/runs/{run}.json"

    def from_bucket(self, url: str) -> str:
        """A copy on the VM of a folder in the bucket (a run's TensorBoard events), for fab to download; named
        by a hash of its URL, which may hold anything."""
        return f"{self.root}/from-bucket/{hashlib.sha256(url.rstrip('/').encode()).hexdigest()[:16]}"

    def tool(self, script: str) -> str:
        return f"{self.bin}/{script}"


def write_json(path: str, data: dict) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_json(path: str) -> dict | None:
    """A record tpu-rl wrote: None if it is missing, half written, or not an object (never ours)."""
    try:
        with open(path) as f:
            found = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return found if isinstance(found, dict) else None


def finished_steps(directory: str, listing=gcs.names) -> list[int]:
    """The finished steps under a checkpoint directory, in order: on a disk Orbax renames a step's temporary
    folder when it is complete; in Cloud Storage it writes commit_success.txt into the step's folder last
    (`listing`: the gs:// names below a prefix, through gcs.py or another client). The one rule for a
    committed step, on the VM and on gke: an uncommitted one is never resumed from or exported."""
    if gcs.is_gcs(directory):
        prefix = f"{directory.rstrip('/')}/"
        committed = (re.fullmatch(r"([0-9]+)/commit_success\.txt", n.removeprefix(prefix)) for n in listing(prefix))
        return sorted(int(m.group(1)) for m in committed if m)
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(directory) else []


def latest_step(directory: str) -> str:
    """The highest finished step under a checkpoint directory."""
    steps = finished_steps(directory)
    if not steps:
        raise LookupError(f"no checkpoint step under {directory}")
    return str(steps[-1])


def resolve_runtime(text: str) -> str:
    def replace(match: re.Match) -> str:
        if match.group(1) == "hostname":
            return os.uname().nodename
        return latest_step(os.path.expanduser(match.group(2)))

    return DEFERRED.sub(replace, text)


def matches(pattern: str) -> list[str]:
    """What an output's glob names now: files and folders, or objects and "folders" in the bucket."""
    return gcs.matches(pattern) if gcs.is_gcs(pattern) else sorted(glob.glob(os.path.expanduser(pattern)))


def missing_outputs(patterns: list[str]) -> list[str]:
    """Outputs (globs) with no match, or whose only matches are empty directories (a bucket has none)."""
    missing = []
    for pattern in patterns:
        found = matches(pattern)
        if not (gcs.is_gcs(pattern) and found) and not any(
            os.path.isfile(m) or (os.path.isdir(m) and os.listdir(m)) for m in found
        ):
            missing.append(pattern)
    return missing


def seals(outputs: list[str]) -> dict[str, str]:
    """The SHA-256 of each output that is a small file on the VM (a bucket is the project's own, by IAM)."""
    found = {}
    for path in outputs:
        if not gcs.is_gcs(path) and os.path.isfile(path) and os.path.getsize(path) <= SEAL_MAX_BYTES:
            with open(path, "rb") as f:
                found[path] = hashlib.sha256(f.read()).hexdigest()
    return found


def broken_seals(done: dict) -> list[str]:
    """The sealed outputs of a done marker that differ now (or are no longer plain files)."""
    sealed = done.get("seals") or {}
    now = seals(list(sealed))
    return [path for path, digest in sorted(sealed.items()) if now.get(path) != digest]


def inputs_digest(paths: list[str]) -> str:
    """What a job read, as one hash: a missing input hashes differently from an empty one."""
    digest = hashlib.sha256()
    for path in paths:
        try:
            with open(os.path.expanduser(path), "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
        except FileNotFoundError:
            digest.update(b"missing")
    return digest.hexdigest()


def restore(job_dir: str, spec: dict) -> bool:
    """Take a job as done from its record in the bucket (made on a VM since lost), its outputs verified
    there again; False when there is no record or an output is missing."""
    text = gcs.read(spec["record"])
    try:
        done = json.loads(text) if text is not None else None
    except ValueError:
        done = None  # half a record (it is written in one request, but a bucket is not ours alone)
    if not isinstance(done, dict) or not isinstance(done.get("finished"), (int, float)):
        return False
    if missing_outputs(spec["outputs"]):
        return False
    os.makedirs(job_dir, mode=0o700, exist_ok=True)
    write_json(os.path.join(job_dir, SPEC), spec)
    faults.point("restore.wrote-spec")
    write_json(os.path.join(job_dir, DONE), {**done, "restored_from": spec["record"]})
    faults.point("restore.wrote-done")
    write_json(os.path.join(job_dir, RESULT), {"exit_code": 0, "finished": done["finished"], "error": None})
    faults.point("restore.wrote-result")
    return True


def job_state(job_dir: str, planned: dict | None = None) -> dict:
    """The job's state and the facts behind it (times, exit code, outputs). With its `planned` spec, a job
    never run here but recorded done in the bucket is restored first (see `restore`)."""
    path = lambda name: os.path.join(job_dir, name)  # noqa: E731
    if planned and planned.get("record") and not os.path.exists(path(RUNNER)) and not os.path.exists(path(DONE)):
        restore(job_dir, planned)
    spec = read_json(path(SPEC)) or {}
    runner, process = read_json(path(RUNNER)), read_json(path(PROCESS))
    result, done = read_json(path(RESULT)), read_json(path(DONE))
    log = path(LOG)
    state = {"job_dir": job_dir, "log": log, "log_bytes": os.path.getsize(log) if os.path.exists(log) else 0}
    if runner:
        state["started"] = runner.get("started")
    if result:
        state.update(finished=result["finished"], exit_code=result["exit_code"], error=result.get("error"))
    if done:
        if not result:  # read between its runner's two last writes: verified, no verdict yet (never adopted)
            state.update(finished=done["finished"], exit_code=0, error=None)
        missing = missing_outputs(spec.get("outputs", []))
        state.update(state=JobState.LOST if missing else JobState.DONE, outputs=done["outputs"], missing=missing)
        if not missing and (changed := broken_seals(done)):
            names = ", ".join(os.path.basename(path) for path in changed)
            state.update(state=JobState.LOST, changed=changed, error=f"{names} changed since it was verified")
        if done.get("restored_from"):
            state["restored_from"] = done["restored_from"]
        if not missing and spec.get("inputs") and done.get("inputs") != inputs_digest(spec["inputs"]):
            gone = not any(os.path.exists(os.path.expanduser(path)) for path in spec["inputs"])
            if gone and spec.get("may_hold") and held(spec):  # a decision not to copy is never a copy
                state.update(state=JobState.LOST, held_gone=True, error="the model it held back is gone")
            elif gone and (planned is None or planned.get("inputs") == spec["inputs"]):
                state["source_gone"] = spec["inputs"]  # a restart wiped /dev/shm: the verified copy is the result
            else:  # changed, or the plan now copies another export
                state.update(state=JobState.STALE, error=f"{', '.join(spec['inputs'])} changed")
    elif result:
        state["state"] = JobState.STOPPED if result["exit_code"] == STOPPED_EXIT else JobState.FAILED
    elif processes.alive(runner) or processes.alive(process):
        state["state"] = JobState.RUNNING
    elif runner:
        state["state"] = JobState.INTERRUPTED
    else:
        state["state"] = JobState.PENDING
    state["state"] = state["state"].value
    return state


def held(spec: dict) -> bool:
    """Whether a durable copy's job decided to keep the model off its target (its marker, the first output, says
    why: results.publish_if): then the VM's copy it decided about is the only one."""
    return bool((read_json(os.path.expanduser(spec["outputs"][0])) or {}).get("held"))


def _secret_env(spec: dict) -> dict:
    """The job's secrets from the VM's secrets folder: each of `secrets`, and of `optional_secrets` those stored
    (the W&B key: without it train logs to W&B offline)."""
    env = {}
    for name in [*spec.get("secrets", []), *spec.get("optional_secrets", [])]:
        path = os.path.join(os.path.expanduser(spec["secrets_dir"]), name)
        if name in spec.get("secrets", []) or os.path.isfile(path):
            with open(path) as f:
                env[name] = f.read().strip()
    return env


def _expand(value: str) -> str:
    return os.path.expanduser(resolve_runtime(value))


def _wait_gone(record: dict) -> None:
    while processes.alive(record):
        processes.wait_for_an_end([record], 1)


class _Job:
    """One job folder, as its runner sees it."""

    def __init__(self, job_dir: str):
        self.dir = job_dir
        self.spec = read_json(self.path(SPEC))

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def note(self, log, text: str) -> None:
        log.write(f"[tpu-rl] {text}\n".encode())

    def step(self, argv: list[str], env: dict, log, index: int) -> int:
        """Run one command (step `index`: 0 the job's own, then its `after` steps) in its own process
        group; its exit code is kept in a file, so a runner that dies does not lose it and a new runner
        can adopt the process, and go on with the steps after it."""
        exit_file = self.path(EXIT_CODE)
        if os.path.exists(exit_file):
            os.remove(exit_file)
            faults.point("run.forgot-step-exit-code")
        # The command starts only once its process is recorded: a runner that dies before that leaves no
        # unrecorded copy running beside the next attempt (the shell reads "go", or EOF, and then exits).
        import subprocess  # here, not above: every fab command starts a tool on the VM, and few start a process

        wrapper = ["/bin/sh", "-c", GO_THEN_RUN, exit_file, *argv]
        cwd = os.path.expanduser(self.spec.get("cwd", "~"))
        child = subprocess.Popen(
            wrapper, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True
        )
        faults.point("run.started-process")
        write_json(self.path(PROCESS), {**processes.identity(child.pid), "step": index})
        faults.point("run.recorded-process")
        child.stdin.write(b"go\n")
        child.stdin.close()
        faults.point("run.process-going")
        forward = lambda signum, _frame: os.killpg(child.pid, signum)  # noqa: E731
        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        child.wait()
        faults.point("run.step-ended")
        return self.exit_code()

    def exit_code(self) -> int:
        try:
            with open(self.path(EXIT_CODE)) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return -signal.SIGKILL  # the shell itself was killed: no code

    def adoptable(self) -> bool:
        """Its process outlived a dead runner: still running, or ended with its exit code kept and not yet verified
        (a `done` without a verdict was verified: once its outputs are lost, the job runs again)."""
        process = read_json(self.path(PROCESS))
        judged = os.path.exists(self.path(RESULT)) or os.path.exists(self.path(DONE))
        ended = os.path.exists(self.path(EXIT_CODE)) and not judged
        return bool(process) and (processes.alive(process) or ended)

    def run(self) -> int:
        """Run (or adopt) the job, then write its verdict."""
        self.inputs = inputs_digest(self.spec.get("inputs") or [])  # as the job is about to read them
        write_json(
            self.path(RUNNER), {**processes.identity(os.getpid()), "started": time.time(), "host": os.uname().nodename}
        )
        faults.point("run.recorded-runner")
        exit_code, error = 1, None
        with open(self.path(LOG), "ab", buffering=0) as log:
            try:
                env = {**os.environ, **{k: _expand(v) for k, v in self.spec["env"].items()}, **_secret_env(self.spec)}
                if self.adoptable():
                    self.note(log, "re-attached to the job (its runner had stopped)")
                    process = read_json(self.path(PROCESS))
                    _wait_gone(process)
                    exit_code = self.exit_code()
                    if exit_code == 0:  # the steps after the adopted one, as its runner would have run them
                        exit_code, error = self.start(env, log, first=int(process.get("step", 0)) + 1)
                else:
                    exit_code, error = self.start(env, log)
                if exit_code == STOPPED_EXIT:
                    error = "stopped by a health rule (its log's [tpu-rl] health line says which)"
                elif exit_code and not error:
                    error = f"exited with {exit_code}" if exit_code > 0 else "its process was killed"
            except (OSError, LookupError, KeyError) as err:
                exit_code, error = 1, f"could not start: {err}"
                self.note(log, error)
            if exit_code == 0:
                error = self.verify(log)
        # `done` before the verdict: a reader between the two writes must never see exit 0 without `done` (failed)
        if exit_code == 0 and not error:
            write_json(self.path(DONE), self.done)
            faults.point("run.wrote-done")
        write_json(self.path(RESULT), {"exit_code": exit_code, "finished": time.time(), "error": error})
        faults.point("run.wrote-result")
        return exit_code

    def verify(self, log) -> str | None:
        """After exit 0: every output there (in the bucket, for those that live there), then the record;
        what is wrong, or None."""
        try:
            if missing := missing_outputs(self.spec["outputs"]):
                error = f"exited 0 but outputs are missing: {', '.join(missing)}"
            else:
                outputs = sorted(m for p in self.spec["outputs"] for m in matches(p))
                self.done = {
                    "finished": time.time(),
                    "outputs": outputs,
                    "inputs": self.inputs,
                    "seals": seals(outputs),
                }
                if self.spec.get("record"):
                    gcs.write(self.spec["record"], json.dumps(self.done).encode())
                    faults.point("run.recorded-in-bucket")
                    self.note(log, f"recorded as done in the bucket: {self.spec['record']}")
                return None
        except OSError as err:
            error = f"could not verify its outputs in the bucket: {err}"
        self.note(log, error)
        return error

    def start(self, env: dict, log, first: int = 0) -> tuple[int, str | None]:
        """Run the steps from `first` on (0: the job's own command, then each of `after`) until one fails."""
        steps = [self.spec["argv"], *(self.spec.get("after") or [])]
        exit_code = 0
        for index in range(first, len(steps)):
            command = [_expand(a) for a in steps[index]]
            self.note(log, f"starting {self.spec['name']}" if index == 0 else f"then: {' '.join(command)}")
            if exit_code := self.step(command, env, log, index):
                break
        return exit_code, None


# What a fresh attempt removes, in this order, and the crash point after each.
FORGOTTEN = (
    (EXIT_CODE, "launch.forgot-exit-code"),
    (PROCESS, "launch.forgot-process"),
    (RESULT, "launch.forgot-result"),
    (DONE, "launch.forgot-done"),
    (RUNNER, "launch.forgot-runner"),
)


def launch(job_dir: str, spec_text: str) -> dict:
    """Start the job detached and return its state once its runner has recorded it.

    A job whose runner lives (it may be writing its verdict as the driver decided) or that is done by now is left
    alone: a second attempt would remake verified outputs. A job whose runner died but whose process lives gets a
    new runner that adopts it. Raises RuntimeError when the runner did not start.
    """
    os.makedirs(job_dir, mode=0o700, exist_ok=True)
    state = job_state(job_dir)
    runner = read_json(os.path.join(job_dir, RUNNER))
    if processes.alive(runner) or state["state"] == JobState.DONE.value:
        return state
    if state["state"] != JobState.RUNNING.value and not _Job(job_dir).adoptable():
        # A fresh attempt: forget the old verdict, its exit code and process first (a launch stopped midway
        # must never leave an old exit 0 for the next one to adopt), and keep the old log aside.
        for name, crash in FORGOTTEN:
            if os.path.exists(os.path.join(job_dir, name)):
                os.remove(os.path.join(job_dir, name))
                faults.point(crash)
        log = os.path.join(job_dir, LOG)
        if os.path.exists(log) and os.path.getsize(log):
            os.replace(log, f"{log}.{time.time_ns()}")
            faults.point("launch.kept-old-log")
        spec = json.loads(spec_text)
        for name, text in (spec.get("files") or {}).items():  # what the job reads from its folder (a model card)
            with open(os.path.join(job_dir, os.path.basename(name)), "w") as f:
                f.write(text)
            faults.point("launch.wrote-files")
        with open(os.path.join(job_dir, f"{SPEC}.tmp"), "w") as f:
            f.write(spec_text)
        os.replace(os.path.join(job_dir, f"{SPEC}.tmp"), os.path.join(job_dir, SPEC))
        faults.point("launch.wrote-spec")
    if os.path.exists(os.path.join(job_dir, RUNNER)):  # a dead runner's: wait below for the new one's
        os.remove(os.path.join(job_dir, RUNNER))
        faults.point("launch.removed-dead-runner")
    argv = [sys.executable, os.path.abspath(__file__), "run", job_dir]
    ready = lambda _: os.path.exists(os.path.join(job_dir, RUNNER))  # noqa: E731
    processes.start(lambda: main(argv[2:]), argv, os.path.join(job_dir, RUNNER_ERR), ready, "the job runner")
    return job_state(job_dir)


def record_run(layout: Layout, run: str) -> None:
    """The run that later fab commands continue."""
    with open(layout.current_run + ".tmp", "w") as f:
        f.write(run + "\n")
    os.replace(layout.current_run + ".tmp", layout.current_run)
    faults.point("current-run.recorded")


def main(argv: list[str]) -> int:
    os.umask(0o077)  # logs, state and outputs of tpu-rl are the SSH user's alone
    command, args = (argv[0], argv[1:]) if argv else ("help", [])
    try:
        if command == "run":  # the runner rides out a storage outage; fab's commands answer within its timeout
            return _Job(os.path.expanduser(args[0])).run()
        if command == "status":
            with gcs.quick():
                print(json.dumps([job_state(os.path.expanduser(d)) for d in args]))
            return 0
        if command == "trusted":
            return trusted(args[0], args[1] if len(args) > 1 else None)
        if command == "copy-down":
            with gcs.quick():
                print(gcs.copy_down(args[0], os.path.expanduser(args[1])))
            return 0
    except OSError as err:
        return os_error(command, err)
    print(__doc__, file=sys.stderr)
    return 64


def trusted(folder: str, job_dir: str | None) -> int:
    """What fab checks before it reads a folder of outputs again (download, metrics): the folder is the SSH
    user's alone, and the job that made it is done, its sealed outputs unchanged. One line and 65 if not."""
    why = None if gcs.is_gcs(folder) else folders.problem(folder)
    state = job_state(os.path.expanduser(job_dir)) if job_dir and why is None else {"state": JobState.DONE.value}
    if why is None and state["state"] != JobState.DONE.value:
        why = f"{folder}: its job is {state['state']}" + (f" ({state['error']})" if state.get("error") else "")
    if why is not None:
        print(f"{why}; nothing read from it", file=sys.stderr)
        return 65
    done = read_json(os.path.join(os.path.expanduser(job_dir), DONE)) if job_dir else None
    print(json.dumps((done or {}).get("seals") or {}))
    return 0


def os_error_text(err: OSError) -> str:
    """A failed file operation on the VM in one line; a full disk says what to do."""
    where = f" ({err.filename})" if err.filename else ""
    hint = "; free some space on the VM" if err.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return f"{err.strerror or err}{where}{hint}"


def os_error(command: str, err: OSError) -> int:
    print(f"{command}: {os_error_text(err)}", file=sys.stderr)
    return 74


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
