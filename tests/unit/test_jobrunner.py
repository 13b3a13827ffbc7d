"""The VM-side runner's pieces that need no SSH: outputs, steps, inputs, preflight, redaction."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bootstrap.paths import REPO
from bootstrap.remote import faults, joblog, jobrunner, preflight, processes
from tests.loopback import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standin"))


def test_latest_step_ignores_orbax_temporary_dirs(tmp_path):
    for name in ("10", "50", "8", "60.orbax-checkpoint-tmp-1700000000", "tmp"):
        (tmp_path / name).mkdir()
    assert jobrunner.latest_step(str(tmp_path)) == "50"
    with pytest.raises(LookupError, match="no checkpoint step under"):
        jobrunner.latest_step(str(tmp_path / "missing"))


def test_runtime_values(tmp_path):
    (tmp_path / "7").mkdir()
    assert (
        jobrunner.resolve_runtime(f"{tmp_path}/${{latest_step:{tmp_path}}}/model_params")
        == f"{tmp_path}/7/model_params"
    )
    assert jobrunner.resolve_runtime("${hostname}") == socket.gethostname()


def test_missing_outputs(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("1")
    assert jobrunner.missing_outputs(
        [str(tmp_path / "empty"), str(tmp_path / "full"), str(tmp_path / "*.safetensors")]
    ) == [
        str(tmp_path / "empty"),
        str(tmp_path / "*.safetensors"),
    ]


def request(tmp_path, **changes) -> dict:
    return {
        "chips": 2,
        "chip_glob": str(tmp_path / "vfio" / "[0-9]*"),
        "min_memory_gb": 0,
        "min_shm_gb": 0,
        "shm_path": str(tmp_path),
        "libtpu_lockfile": str(tmp_path / "libtpu_lockfile"),
        "secrets": {},
        **changes,
    }


def failed(checks: list[dict]) -> dict[str, str]:
    return {c["check"]: c["message"] for c in checks if not c["ok"]}


def test_preflight_counts_chips_memory_and_shm(tmp_path):
    (tmp_path / "vfio").mkdir()
    (tmp_path / "vfio" / "0").write_text("")
    problems = failed(preflight.checks(request(tmp_path, min_memory_gb=10**6, min_shm_gb=10**6)))
    assert problems["chips"].startswith("1 TPU chips visible") and "2 expected" in problems["chips"]
    assert "1000000 GB needed" in problems["memory"]
    assert f"free in {tmp_path}" in problems["shm"]


def test_preflight_removes_a_stale_libtpu_lock(tmp_path):
    (tmp_path / "vfio").mkdir()
    for chip in ("0", "1"):
        (tmp_path / "vfio" / chip).write_text("")
    (tmp_path / "libtpu_lockfile").write_text("")
    checks = preflight.checks(request(tmp_path))
    assert failed(checks) == {}
    assert any("removed stale" in c["message"] for c in checks)
    assert not (tmp_path / "libtpu_lockfile").exists()


def test_preflight_names_the_process_holding_the_tpu(tmp_path):
    (tmp_path / "vfio").mkdir()
    for chip in ("0", "1"):
        (tmp_path / "vfio" / chip).write_text("")
    holder = subprocess.Popen(  # holds the chip open until its stdin closes
        [sys.executable, "-c", f"f = open({str(tmp_path / 'vfio' / '1')!r}); import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while not failed(preflight.checks(request(tmp_path))) and time.monotonic() < deadline:
            time.sleep(0.1)
        message = failed(preflight.checks(request(tmp_path)))["tpu_free"]
        assert f"pid {holder.pid}" in message and f"kill {holder.pid}" in message
    finally:
        holder.kill()


def test_preflight_lets_the_pipelines_own_validator_hold_the_tpu(tmp_path):
    """validate (MaxText's validator and the environment check) opens the chips while convert, on the CPU, starts
    beside it: a holder in the process group of one of the pipeline's own running jobs is not in the way; any
    other holder still is."""
    (tmp_path / "vfio").mkdir()
    for chip in ("0", "1"):
        (tmp_path / "vfio" / chip).write_text("")
    hold = f"f = open({str(tmp_path / 'vfio' / '0')!r}); import sys; sys.stdin.read()"
    ours = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not failed(preflight.checks(request(tmp_path))) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert f"pid {ours.pid}" in failed(preflight.checks(request(tmp_path)))["tpu_free"]
        checks = preflight.checks(request(tmp_path), {ours.pid})
        assert failed(checks) == {} and any("own running job" in c["message"] for c in checks)
        assert "tpu_free" in failed(preflight.checks(request(tmp_path), {ours.pid + 10**6}))
    finally:
        ours.kill()


def test_preflight_secret_must_be_stored(tmp_path):
    (tmp_path / "vfio").mkdir()
    for chip in ("0", "1"):
        (tmp_path / "vfio" / chip).write_text("")
    secret = tmp_path / "HF_TOKEN"
    secret.write_text("x")
    assert failed(preflight.checks(request(tmp_path, secrets={"HF_TOKEN": str(secret)}))) == {}
    secret.unlink()
    assert (
        "is missing"
        in failed(preflight.checks(request(tmp_path, secrets={"HF_TOKEN": str(secret)})))["secret HF_TOKEN"]
    )


def test_run_marks_done_only_after_outputs_exist(tmp_path):
    out = tmp_path / "out.txt"
    spec = {
        "name": "m",
        "argv": [sys.executable, "-c", "print('hi')"],
        "env": {},
        "secrets": [],
        "outputs": [str(out)],
        "cwd": str(tmp_path),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert jobrunner._Job(str(tmp_path)).run() == 0  # exits 0 ...
    assert jobrunner.job_state(str(tmp_path))["state"] == "failed"  # ... but wrote nothing
    assert "outputs are missing" in (tmp_path / "log").read_text()
    spec["argv"] = [sys.executable, "-c", f"open({str(out)!r}, 'w').write('x')"]
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert jobrunner._Job(str(tmp_path)).run() == 0
    assert jobrunner.job_state(str(tmp_path))["state"] == "done"
    out.unlink()  # /dev/shm wiped by a restart
    assert jobrunner.job_state(str(tmp_path))["state"] == "lost"


def test_a_job_done_for_inputs_that_changed_is_stale(tmp_path):
    """A copy of an export is done only for that export: a new SHA256SUMS makes it run again."""
    sums, marker = tmp_path / "SHA256SUMS", tmp_path / "copied.json"
    sums.write_text("aaaa  model.safetensors\n")
    spec = {"name": "copy", "argv": ["touch", str(marker)], "env": {}, "outputs": [str(marker)], "inputs": [str(sums)]}
    (tmp_path / "spec.json").write_text(json.dumps({**spec, "secrets": [], "cwd": str(tmp_path)}))
    assert jobrunner._Job(str(tmp_path)).run() == 0
    assert jobrunner.job_state(str(tmp_path))["state"] == "done"
    sums.write_text("bbbb  model.safetensors\n")  # exported again: other weights
    state = jobrunner.job_state(str(tmp_path))
    assert (state["state"], state["error"]) == ("stale", f"{sums} changed")


def test_a_reader_never_sees_a_successful_job_without_done(tmp_path, monkeypatch):
    """Found under load: status read between the runner's two last writes said `failed` for a job that exited 0;
    and later `done` with no finish time (CI: goodput's sum of a run then failed on None)."""
    out = tmp_path / "out.txt"
    spec = {
        "name": "m",
        "argv": [sys.executable, "-c", f"open({str(out)!r}, 'w').write('x')"],
        "env": {},
        "outputs": [str(out)],
    }
    (tmp_path / "spec.json").write_text(json.dumps({**spec, "secrets": [], "cwd": str(tmp_path)}))
    seen = []
    write = jobrunner.write_json

    def spying_write(path, data):
        write(path, data)
        seen.append(jobrunner.job_state(str(tmp_path)))  # what a concurrent `status` would say now

    monkeypatch.setattr(jobrunner, "write_json", spying_write)
    assert jobrunner._Job(str(tmp_path)).run() == 0
    states = [state["state"] for state in seen]
    assert "failed" not in states and states[-1] == "done" and states.count("done") == 2  # after each write
    done = [state for state in seen if state["state"] == "done"]
    assert all(isinstance(state["finished"], float) and state["exit_code"] == 0 for state in done)
    assert done[0]["finished"] <= done[1]["finished"] and done[0]["started"] <= done[0]["finished"]


def counted_job(tmp_path, writes: str) -> tuple[Path, dict, Path, Path]:
    """A job whose command counts its runs and writes `writes` into its one output: its folder, spec, output, count."""
    out, runs = tmp_path / "out.txt", tmp_path / "runs.txt"
    argv = ["sh", "-c", f"echo x >> {runs}; echo {writes} > {out}"]
    spec = {"name": "m", "argv": argv, "env": {}, "secrets": [], "outputs": [str(out)], "cwd": str(tmp_path)}
    job = tmp_path / "job"
    job.mkdir()
    (job / jobrunner.SPEC).write_text(json.dumps(spec))
    return job, spec, out, runs


def test_a_job_verified_then_lost_runs_again_whole_not_adopted(tmp_path):
    """Its runner killed between its two last writes (done, no verdict), then its outputs wiped (a restart's
    /dev/shm): the next launch runs the job again, not a re-attach to the old exit 0 that then fails verifying, and
    the new attempt's times are its own (the old `done`'s would end it before its start: a damaged record)."""
    job, spec, out, runs = counted_job(tmp_path, "x")
    runner = [sys.executable, str(REPO / "bootstrap" / "remote" / "jobrunner.py"), "run", str(job)]
    killed = subprocess.run(runner, env={**os.environ, faults.ENV: "run.wrote-done@1"}, cwd=REPO)
    assert killed.returncode == -9 and (job / jobrunner.DONE).exists() and not (job / jobrunner.RESULT).exists()
    out.unlink()
    assert jobrunner.job_state(str(job))["state"] == "lost"
    jobrunner.launch(str(job), json.dumps(spec))
    wait_for(lambda: jobrunner.job_state(str(job))["state"] != "running", 60, "the job to end")
    state = jobrunner.job_state(str(job))
    assert state["state"] == "done" and out.exists() and runs.read_text() == "x\nx\n"
    assert state["started"] <= state["finished"]


def test_a_launch_that_finds_the_job_done_or_its_runner_alive_starts_nothing(tmp_path):
    """The driver decided while the job ran; by its launch the runner has written `done` (its verdict next), or
    all: the verified output is never made again, beside the runner or after it."""
    job, spec, out, runs = counted_job(tmp_path, "new")
    out.write_text("verified\n")
    jobrunner.write_json(str(job / jobrunner.PROCESS), {"pid": 1, "start": -1})  # its shell: ended
    (job / jobrunner.EXIT_CODE).write_text("0\n")
    jobrunner.write_json(str(job / jobrunner.DONE), {"finished": time.time(), "outputs": [str(out)], "seals": {}})
    jobrunner.write_json(str(job / jobrunner.RUNNER), {**processes.identity(os.getpid()), "started": time.time()})
    assert jobrunner.launch(str(job), json.dumps(spec))["state"] == "done"  # its runner alive, no verdict yet
    jobrunner.write_json(str(job / jobrunner.RESULT), {"exit_code": 0, "finished": time.time(), "error": None})
    (job / jobrunner.RUNNER).unlink()  # its runner gone: done, all written
    assert jobrunner.launch(str(job), json.dumps(spec))["state"] == "done"
    assert out.read_text() == "verified\n" and not runs.exists() and (job / jobrunner.DONE).exists()


def test_the_vm_redacts_the_secrets_it_holds_at_every_split_of_the_stream(tmp_path):
    """What follow and tail send: the stored token is <redacted> wherever the chunks happen to end."""
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "HF_TOKEN").write_text("hf_stored0123456789\n")
    # plain, split by a carriage return (two lines once split), and coloured in the middle
    log = b"start hf_stored0123456789 middle hf_stor\red0123456789end\nx hf_st\x1b[1mored0123456789\n"
    expected = b"start <redacted> middle <redacted>end\nx <redacted>\n"
    for cut in range(len(log) + 1):
        redactor = joblog.Redactor(str(tmp_path / "secrets"))
        shown = redactor.feed(log[:cut]) + redactor.feed(log[cut:]) + redactor.feed(b"")
        assert shown == expected, cut


def test_a_token_the_vm_no_longer_holds_is_redacted_in_an_older_log(tmp_path):
    """After the token was changed, the secrets folder holds the new one; a log written before shows the old
    one <redacted> too (anything shaped like a Hugging Face token), also split by a colour code."""
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "HF_TOKEN").write_text("hf_" + "N" * 34)
    old = b"hf_" + b"AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"
    log = b"token " + old + b" refused\nx " + old[:10] + b"\x1b[1m" + old[10:] + b"\n"
    for cut in range(len(log) + 1):
        redactor = joblog.Redactor(str(tmp_path / "secrets"))
        shown = redactor.feed(log[:cut]) + redactor.feed(log[cut:]) + redactor.feed(b"")
        assert shown == b"token <redacted> refused\nx <redacted>\n", cut
    script = (  # the shape's pattern stays linear on crafted input, in a child: a regression is a timeout here
        "import sys; from bootstrap.remote.joblog import Redactor\n"
        "r = Redactor(sys.argv[1]); r.feed(b'hf_' + b'a\\x1b]\\x07' * 5000 + b'!'); r.feed(b'')\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "secrets")], cwd=REPO, check=True, timeout=30)


def test_tail_shows_the_last_lines_redacted(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "HF_TOKEN").write_text("hf_tail0123456789")
    (job / jobrunner.SPEC).write_text(json.dumps({"secrets_dir": str(tmp_path / "secrets")}))
    (job / jobrunner.LOG).write_text("one\ntwo hf_tail0123456789\nthree\n")
    result = subprocess.run(
        [sys.executable, joblog.__file__, "tail", str(job), "2"], capture_output=True, text=True, check=True
    )
    assert result.stdout == "two <redacted>\nthree\n"


def test_redaction_stays_linear_on_crafted_escapes_and_finds_a_coloured_token_across_chunks(tmp_path):
    token = b"hf_fake-token-abcdefghijklmnopqrstuvwxyz"
    (tmp_path / "HF_TOKEN").write_bytes(token)
    script = (  # in a child, so that a regression is a timeout here, not a hung suite
        "import sys; from bootstrap.remote.joblog import Redactor\n"
        "r = Redactor(sys.argv[1]); r.feed(b'h' + b'\\x1b]\\x07' * 5000 + b'X'); r.feed(b'')\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, check=True, timeout=30)
    coloured = b"".join(token[i : i + 1] + b"\x1b[38;5;196m" for i in range(len(token)))
    log = b"x" * 65536 + coloured + b"\n"
    for cut in (65536, 65536 + 100, 65536 + 300):
        redactor = joblog.Redactor(str(tmp_path))
        shown = redactor.feed(log[:cut]) + redactor.feed(log[cut:]) + redactor.feed(b"")
        assert b"<redacted>" in shown and b"hf_abc" not in shown, cut


def test_tail_starts_at_a_whole_line_so_a_token_cut_by_the_seek_never_shows(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (tmp_path / "secrets").mkdir()
    token = "hf_fake-token-abcdefghijklmnopqrstuvwxyz"
    (tmp_path / "secrets" / "HF_TOKEN").write_text(token)
    (job / jobrunner.SPEC).write_text(json.dumps({"secrets_dir": str(tmp_path / "secrets")}))
    (job / jobrunner.LOG).write_text("x" * 10 + token + "\n" + "y" * (2**20 - len(token) + 5) + "\nlast\n")
    result = subprocess.run(
        [sys.executable, joblog.__file__, "tail", str(job), "5"], capture_output=True, text=True, check=True
    )
    assert token[-10:] not in result.stdout and result.stdout.endswith("last\n")


def test_a_copy_whose_source_is_gone_stays_done_unless_the_plan_copies_another(tmp_path):
    """A restart wiped the export a copy was made from: the copy is the run's result (done). A plan that now
    copies another export (export_dir changed) makes it stale; so does an export made again."""
    source = tmp_path / "export" / "SHA256SUMS"
    source.parent.mkdir()
    source.write_text("abc  model.safetensors\n")
    out = tmp_path / "copied.json"
    spec = {"name": "publish-gcs", "argv": [sys.executable, "-c", f"open({str(out)!r}, 'w').write('{{}}')"],
            "env": {}, "secrets": [], "outputs": [str(out)], "inputs": [str(source)], "cwd": str(tmp_path)}  # fmt: skip
    job = tmp_path / "job"
    job.mkdir()
    (job / "spec.json").write_text(json.dumps(spec))
    assert jobrunner._Job(str(job)).run() == 0 and jobrunner.job_state(str(job))["state"] == "done"
    source.unlink()
    gone = jobrunner.job_state(str(job), spec)
    assert gone["state"] == "done" and gone["source_gone"] == [str(source)]
    elsewhere = {**spec, "inputs": [str(tmp_path / "other" / "SHA256SUMS")]}
    assert jobrunner.job_state(str(job), elsewhere)["state"] == "stale"
    source.write_text("def  model.safetensors\n")  # exported again
    assert jobrunner.job_state(str(job), spec)["state"] == "stale"


def test_a_wait_ends_when_a_process_it_watches_ends_and_never_early_for_one_gone_before():
    """The driver's look after a job's end comes at once, not at the end of its poll: a wait of a minute on a
    process that ends now returns long before. A process that ended before, or a pid that now names another
    process, never cuts a wait short (the driver would spin): the wait is then the whole sleep."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    record = processes.identity(process.pid)
    began = time.monotonic()
    ender = threading.Timer(0.5, process.stdin.close)  # the process ends half a second into the wait
    ender.start()
    processes.wait_for_an_end([None, {}, record], 60)
    assert 0.4 < time.monotonic() - began < 30
    process.wait()
    reused = {**processes.identity(os.getpid()), "start": "1"}  # this pid, another start time: not that process
    began = time.monotonic()
    processes.wait_for_an_end([record, reused], 0.3)
    assert time.monotonic() - began >= 0.3


def test_trusted_reads_a_folder_only_while_its_job_is_done_with_its_seals_intact(tmp_path, capsys):
    """fab download and fab metrics ask `trusted` first: a job that is not done (failed, never run, its sealed file
    changed since) is refused in one line, and nothing is read."""
    folder, job = tmp_path / "export", tmp_path / "job"
    folder.mkdir(mode=0o700)
    job.mkdir()
    sums = folder / "SHA256SUMS"
    spec = {"name": "export", "argv": [sys.executable, "-c", f"open({str(sums)!r}, 'w').write('a  m\\n')"]}
    (job / "spec.json").write_text(json.dumps({**spec, "env": {}, "secrets": [], "outputs": [str(sums)]}))
    assert jobrunner.trusted(str(folder), str(job)) == 65  # never run: pending
    assert "its job is pending; nothing read from it" in capsys.readouterr().err
    assert jobrunner._Job(str(job)).run() == 0
    assert jobrunner.trusted(str(folder), str(job)) == 0
    assert json.loads(capsys.readouterr().out) == {str(sums): jobrunner.seals([str(sums)])[str(sums)]}
    sums.write_text("b  m\n")  # planted after a restart: not what the job verified
    assert jobrunner.trusted(str(folder), str(job)) == 65
    assert "its job is lost (SHA256SUMS changed since it was verified)" in capsys.readouterr().err
