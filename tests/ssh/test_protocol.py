"""The job protocol against the real loopback host: every defect of issue 8, reproduced and fixed.

A launch under load, a killed runner, a dropped connection, run names, the printed hint
run as printed, connection errors, a closed pipe, the token in live output, a full disk,
and several hosts.
"""

from __future__ import annotations

import fcntl
import json
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from fabric import Connection

from bootstrap.jobs.plan import runner_spec
from bootstrap.remote.jobrunner import JobState, Layout
from bootstrap.vm.connect import open_connection
from bootstrap.vm.machine import Vm
from tests.loopback import REPO, Fab, loopback_host, round_trips, wait_for

SLOW_TRAIN = ("--arg", "vars.num_batches=6", "--arg", "train.env.STANDIN_SECONDS=1")


@contextmanager
def cpu_burners(count: int = 2):
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def train_dir(fab: Fab) -> Path | None:
    found = list((fab.tmp / "state" / "runs").glob("*/train/runner.json"))
    return found[0].parent if found else None


def no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr


def test_a_plan_of_many_jobs_is_driven_to_done_on_the_vm_even_under_load(ssh_host, tmp_path):
    """The driver launches each job once its need is done, and fab sees every job's whole log before its end."""
    conn = Connection(
        "127.0.0.1", user=ssh_host.user, port=ssh_host.port, connect_kwargs={"key_filename": str(ssh_host.key)}
    )
    vm = Vm(open_connection(conn), Layout(str(tmp_path / "state")))
    vm.install()
    jobs = []
    for number in range(12):
        out = tmp_path / f"out{number}"
        argv = ["sh", "-c", f"echo job {number}; echo done > {out}"]
        spec = dict(runner_spec(vm.layout, "j", argv, [str(out)]))
        needs = [f"j{number - 1}"] if number else []
        jobs.append({"name": f"j{number}", "job_dir": str(tmp_path / f"job{number}"), "spec": spec, "needs": needs})
    with cpu_burners():
        items = list(vm.drive({"digest": "many", "run": "r", "jobs": jobs, "preflight": {}}))
    assert "started" in items[0] and items[-1] == {**items[-1], "event": "finished", "state": "done"}
    order = [(i.get("event"), i.get("job"), i.get("line")) for i in items[1:]]
    for number in range(12):
        name = f"j{number}"
        assert order.index((None, name, f"job {number}")) < order.index(("end", name, None))  # its log, then its end
        assert vm.states([str(tmp_path / f"job{number}")])[0].state is JobState.DONE
    log = tmp_path / "job0" / "log"
    assert log.stat().st_mode & 0o777 == 0o600  # the SSH user's alone
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    conn.close()


def test_a_killed_runner_is_replaced_by_one_that_adopts_its_job_not_a_second_copy(fab: Fab):
    first = fab.start("train", *SLOW_TRAIN)
    folder = wait_for(lambda: train_dir(fab), what="train to start")
    wait_for(lambda: (folder / "process.json").exists(), what="the job's process")
    first.send_signal(signal.SIGKILL)  # the laptop goes away ...
    first.wait()
    runner = json.loads((folder / "runner.json").read_text())["pid"]
    job = json.loads((folder / "process.json").read_text())["pid"]
    subprocess.run(["kill", "-9", str(runner)], check=True)  # ... and the runner dies too (OOM, a kill)
    assert Path(f"/proc/{job}").exists(), "the job itself goes on"

    second = fab("train", *SLOW_TRAIN)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "train: already running since" in second.stdout or "train: its runner stopped" in second.stdout
    log = (folder / "log").read_text()
    assert log.count("[tpu-rl] starting train") == 1  # never a second copy
    assert "re-attached to the job (its runner had stopped)" in log
    assert (folder / "done").exists() and list(folder.glob("log.*")) == []


def test_a_dropped_connection_stops_fab_in_one_line_and_the_job_goes_on(fab: Fab):
    first = fab.start("train", *SLOW_TRAIN)
    folder = wait_for(lambda: train_dir(fab), what="train to start")
    listener = int((fab.host.key.parent / "sshd.pid").read_text())
    sessions = subprocess.run(["pgrep", "-P", str(listener)], capture_output=True, text=True).stdout.split()
    assert sessions, "fab's SSH connection should be served by a child of the test sshd"
    subprocess.run(["kill", "-9", *sessions], check=True)  # the network drops
    output, _ = first.communicate(timeout=120)
    assert first.returncode == 2, output
    assert "Traceback" not in output and "Socket is closed" not in output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    assert "lost the connection to 127.0.0.1 while watching. The pipeline goes on on the VM" in errors[0]
    assert "watch it again: fab train --run-name" in errors[0]
    assert not (folder / "result.json").exists() or (folder / "done").exists()  # the job was not failed by fab

    again = fab("train", *SLOW_TRAIN)  # attaches to the pipeline, or finds it done
    assert again.returncode == 0, again.stdout + again.stderr
    assert (folder / "log").read_text().count("[tpu-rl] starting train") == 1


@pytest.mark.parametrize("name", ["../../x", "a/b", "", "-x", "a b", "x" * 65, "a..b"])
def test_run_names_outside_the_pattern_are_refused_before_contact(fab: Fab, name):
    result = fab("train", "--run-name", name)
    assert result.returncode == 2
    assert f"--run-name: {name!r} is not a run name (1 to 64 letters" in result.stderr
    assert not (fab.tmp / "state").exists()
    no_traceback(result)


def test_a_run_named_like_the_model_still_shares_convert(fab: Fab):
    assert fab("train", "--arg", "vars.num_batches=2", "--run-name", "first").returncode == 0
    for name in ("llama", "cpu", "1"):  # substrings of convert's own command
        result = fab("train", "--arg", "vars.num_batches=2", "--run-name", name)
        assert result.returncode == 0, result.stderr
        assert "convert: done already" in result.stdout and "prefetch: done already" in result.stdout
    assert len(list((fab.tmp / "state" / "shared").glob("convert-*"))) == 1


def test_the_hint_after_a_failure_works_as_printed_and_does_not_retry(fab: Fab):
    failed = fab("train", "--arg", "vars.num_batches=4", "--arg", "train.env.STANDIN_FAIL=1")
    assert failed.returncode == 2
    hint = re.search(r"Full log: (fab logs [^\n]*?)\. Fix the cause", failed.stderr)[1]
    folder = train_dir(fab)
    before = sorted(p.name for p in folder.iterdir())
    words = shlex.split(hint)
    assert words[:2] == ["fab", "logs"]
    shown = fab(*words[1:])
    assert shown.returncode == 0, shown.stderr
    assert "RuntimeError: simulated failure (STANDIN_FAIL)" in shown.stdout
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing was started again


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fab_at(fab: Fab, target: str, *args: str, key: Path | None = None) -> subprocess.CompletedProcess:
    command = [fab.command()[0], "-r", str(REPO), "-H", target, "-i", str(key or fab.host.key), *args]
    return subprocess.run(command, env=fab.env(), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_fabs_connection_sends_each_message_at_once(ssh_host):
    """TCP_NODELAY from the handshake on: with Nagle's algorithm, a message written in two parts (a request,
    then its EOF) waited for the server's delayed ACK, 40 ms a round trip on Linux."""
    conn = Connection(
        "127.0.0.1", user=ssh_host.user, port=ssh_host.port, connect_kwargs={"key_filename": str(ssh_host.key)}
    )
    with open_connection(conn) as opened:
        assert opened.transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        assert "sock" not in opened.connect_kwargs  # opened again, it makes a socket of its own


@pytest.mark.parametrize("task, runs", [("status", 1), ("train", 3)])
def test_connection_refused_is_one_line(fab: Fab, task: str, runs: int):
    """Also while train's Hub check is importing huggingface_hub as fab exits, which printed an import error in
    2 runs of 3 (bootstrap/beside.py)."""
    for _ in range(runs):
        result = fab_at(fab, f"{fab.host.user}@127.0.0.1:{free_port()}", task)
        assert result.returncode == 2
        assert re.fullmatch(r"error: \S+: connection refused \(the VM may still be booting.*\)\n", result.stderr)
        assert re.fullmatch(r"(connecting to 127\.0\.0\.1 \(-H\)\n)?", result.stdout)
        no_traceback(result)


def test_a_silent_server_times_out_in_one_line(fab: Fab):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.monotonic()
        result = fab_at(fab, f"{fab.host.user}@127.0.0.1:{silent.getsockname()[1]}", "-t", "2", "status")
        took = time.monotonic() - started
    assert result.returncode == 2
    assert "the SSH handshake failed within 2 s" in result.stderr or "no answer within 2 s" in result.stderr
    assert result.stderr.count("\n") == 1 and took < 60
    no_traceback(result)


def test_a_refused_key_is_one_line(fab: Fab, tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", tmp_path / "other"], check=True)
    result = fab_at(fab, fab.host.target, "status", key=tmp_path / "other")
    assert result.returncode == 2
    assert f"the VM refused {fab.host.user}'s SSH key" in result.stderr and result.stderr.count("\n") == 1
    assert "the VM's user is tpu-rl:sshUser, default tpu-rl: -H tpu-rl@127.0.0.1" in result.stderr  # stumble 9
    no_traceback(result)


def test_several_hosts_are_refused_with_a_pointer_to_gke(fab: Fab):
    result = fab_at(fab, f"{fab.host.target},{fab.host.user}@127.0.0.1:{free_port()}", "status")
    assert result.returncode == 2
    assert "the SSH backend drives one VM, but 2 hosts were given" in result.stderr
    assert "Pathways on GKE" in result.stderr
    assert not (fab.tmp / "state").exists()
    offline = {**fab.env(), "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # no network: still the real mistake
    command = [fab.command()[0], "-r", str(REPO), "-H", f"{fab.host.target},other@127.0.0.1:1", "train"]
    train = subprocess.run(command, env=offline, capture_output=True, text=True, timeout=120)
    assert train.returncode == 2 and "drives one VM, but 2 hosts were given" in train.stderr, train.stderr
    assert "checking the Hugging Face token" not in train.stdout and "Hub" not in train.stderr
    no_token = {k: v for k, v in offline.items() if k != "HF_TOKEN"} | {"HF_HOME": str(fab.tmp / "no-hf-home")}
    train = subprocess.run(command, env=no_token, capture_output=True, text=True, timeout=120)
    assert train.returncode == 2 and "drives one VM, but 2 hosts were given" in train.stderr, train.stderr


def test_a_closed_pipe_ends_quietly(fab: Fab):
    fab_path = shlex.quote(fab.command()[0])
    result = subprocess.run(
        f"{fab_path} -r {shlex.quote(str(REPO))} plan | true", shell=True, env=fab.env(), capture_output=True, text=True
    )
    assert result.stderr == ""


def test_a_token_printed_by_a_job_is_redacted_live_and_in_fab_logs(fab: Fab):
    leak = ("--arg", "vars.num_batches=2", "--arg", "convert.env.STANDIN_PRINT_TOKEN=1")
    result = fab("train", *leak)
    assert result.returncode == 0, result.stderr
    assert "Error: the Hub refused token <redacted>, retrying" in result.stdout
    assert fab.token not in result.stdout + result.stderr
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    logs = fab("logs", "--job", "convert", *leak)
    assert "Error: the Hub refused token <redacted>, retrying" in logs.stdout and fab.token not in logs.stdout
    assert "\x1b" not in logs.stdout
    # A shell without the token (or after it was rotated): the VM redacts what it holds before sending.
    without = {name: value for name, value in fab.env().items() if name != "HF_TOKEN"}
    blind = subprocess.run(
        fab.command("logs", "--job", "convert", *leak), env=without, capture_output=True, text=True, timeout=120
    )
    assert blind.returncode == 0, blind.stderr
    assert "Error: the Hub refused token <redacted>, retrying" in blind.stdout and fab.token not in blind.stdout


def test_a_token_file_found_with_a_wide_mode_is_fixed_not_refused(fab: Fab):
    assert fab("setup").returncode == 0
    secret = fab.tmp / "state" / "secrets" / "HF_TOKEN"
    secret.chmod(0o644)
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    assert secret.stat().st_mode & 0o777 == 0o600


def test_a_full_disk_is_one_line(fab: Fab):
    state = fab.tmp / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(state)], check=True)
    try:
        assert fab("setup").returncode == 0
        subprocess.run(["dd", "if=/dev/zero", f"of={state}/filler", "bs=4k"], capture_output=True)  # until full
        result = fab("train", "--arg", "vars.num_batches=2")
        assert result.returncode == 2
        assert "No space left on device" in result.stderr and "free some space on the VM" in result.stderr
        no_traceback(result)
    finally:
        subprocess.run(["umount", "-l", str(state)], check=True)


def test_an_sshd_without_sftp_is_one_line(fab: Fab, tmp_path):
    with loopback_host(tmp_path / "no-sftp", sftp=False) as host:
        (fab.home / ".ssh" / "known_hosts").write_text(host.known_hosts_line())
        plain = Fab(host, fab.tmp, fab.token, fab.jobs, fab.hub)
        result = plain("setup")
    assert result.returncode == 2
    assert "offers no SFTP" in result.stderr and "Subsystem sftp" in result.stderr
    no_traceback(result)


def test_tools_replaced_on_the_vm_keep_the_current_run(fab: Fab):
    """fab puts its tools again when they differ (an upgrade): the VM's current run is still the one continued."""
    first = fab("train", "--arg", "vars.num_batches=2")
    assert first.returncode == 0, first.stderr
    run = (fab.tmp / "state" / "current-run").read_text().strip()
    driver = fab.tmp / "state" / "bin" / "driver.py"
    driver.write_text(driver.read_text() + "\n# an older version\n")
    status = fab("status")
    assert status.returncode == 0, status.stderr
    assert f"run {run} (the current run)" in status.stdout
    assert "pipeline: run " in status.stdout  # the pipeline's state read by the tools just put
    assert "# an older version" not in driver.read_text()


def test_a_download_keeps_the_vm_from_autostop_until_it_ends(ssh_host, tmp_path):
    """Every file of a download is fetched while the VM's in-use lock is held (autostop's shutdown takes it
    alone); once the download is over, the lock is free again."""
    conn = Connection(
        "127.0.0.1", user=ssh_host.user, port=ssh_host.port, connect_kwargs={"key_filename": str(ssh_host.key)}
    )
    vm = Vm(open_connection(conn), Layout(str(tmp_path / "state")))
    vm.install()
    (tmp_path / "events").mkdir()
    for name in ("a.tfevents", "b.tfevents"):
        (tmp_path / "events" / name).write_bytes(b"x" * 1000)
    lock = tmp_path / "state" / "pipeline" / "in-use.lock"

    def in_use() -> bool:
        with open(lock, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return False
            except BlockingIOError:
                return True

    held_at_fetch = []
    fetch = vm.fetch
    vm.fetch = lambda path, target: (held_at_fetch.append(in_use()), fetch(path, target))
    assert vm.download(str(tmp_path / "events"), tmp_path / "local") == {"a.tfevents": 1000, "b.tfevents": 1000}
    assert held_at_fetch == [True, True]
    wait_for(lambda: not in_use(), 30, "the hold to end with the download")


def test_fab_status_and_a_no_op_train_are_one_round_trip_each(fab: Fab):
    """Counted by the real sshd: the install reads the expected run's job states too, and a train whose plan
    the VM's driver already brought to done, its outputs still there, hands nothing over."""
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    before = round_trips(fab.host)
    status = fab("status", "--arg", "vars.num_batches=2")
    assert status.returncode == 0, status.stderr
    assert " done " in status.stdout and "export" in status.stdout
    assert round_trips(fab.host) - before == 1
    before = round_trips(fab.host)
    again = fab("train", "--arg", "vars.num_batches=2")
    assert again.returncode == 0 and "export: done already" in again.stdout
    assert "nothing to start" in again.stdout
    assert round_trips(fab.host) - before == 1
    exported = next((fab.tmp / "shm").glob("*/hf-trained/*/config.json"))
    exported.unlink()  # an output gone since (the export in /dev/shm after a reboot): driven again, not a no-op
    before = round_trips(fab.host)
    redone = fab("train", "--arg", "vars.num_batches=2")
    assert redone.returncode == 0 and "nothing to start" not in redone.stdout, redone.stdout
    assert "export: done in" in redone.stdout and exported.exists(), redone.stdout
    # the install read that export will start: the token is checked then, and the plan handed over once
    assert "checking the Hugging Face token" in redone.stdout
    assert round_trips(fab.host) - before == 2
    # a new run: the Hub check runs beside the connection, and the plan is handed over once (not "check first")
    before = round_trips(fab.host)
    new = fab("train", "--new-run", "--arg", "vars.num_batches=2")
    assert new.returncode == 0 and "export: done in" in new.stdout, new.stdout
    assert new.stdout.index("checking the Hugging Face token") < new.stdout.index("pipeline started on")
    assert round_trips(fab.host) - before == 2
