"""Measure fab against the loopback SSH host: the numbers issue 4 asks for.

    .venv/bin/python benchmarks/bench_fab.py [--repeat 5] [--log-mb 500]

1. wall time of `fab train` when every stage is already done (the no-op re-run);
2. the time fab adds to one job, against a plain `ssh host 'python -m ...'` running
   the same stand-in job with the same arguments;
3. the peak memory (max RSS) of `fab logs` following a job that writes a --log-mb log.
Needs what the SSH tests need (sshd, uv, a Python 3.12). Prints a small table.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bootstrap.jobs import load_pipeline, render  # noqa: E402
from tests import hubstub  # noqa: E402
from tests.loopback import REPO, Fab, loopback_host, write_test_jobs  # noqa: E402


def timed(fab: Fab, *args: str) -> float:
    started = time.perf_counter()
    result = fab(*args, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"fab {' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return time.perf_counter() - started


def plain_ssh(fab: Fab, work_dir: Path) -> float:
    """The convert stand-in run with a bare ssh command: no state, no detach, no checks."""
    job = next(j for j in render(load_pipeline(fab.jobs, [f"vars.work_dir={work_dir}"])) if j.name == "convert")
    argv = [str(fab.tmp / "venv" / "bin" / "python3"), *job.argv[1:]]
    token_file = fab.tmp / "state" / "secrets" / "HF_TOKEN"
    command = f"HF_TOKEN=$(cat {token_file}) {shlex.join(argv)} >/dev/null 2>&1"
    host = fab.host
    ssh = [
        "ssh",
        "-q",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-i",
        str(host.key),
        "-p",
        str(host.port),
        f"{host.user}@127.0.0.1",
        command,
    ]
    started = time.perf_counter()
    subprocess.run(ssh, check=True)
    return time.perf_counter() - started


def max_rss_mb(process: subprocess.Popen) -> float:
    _, _, usage = os.wait4(process.pid, 0)
    process.returncode = 0
    return usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--log-mb", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, loopback_host(Path(directory) / "sshd") as host:
        tmp = Path(directory)
        hub, server = hubstub.serve()
        token = "hf_bench" + uuid.uuid4().hex
        hub.tokens[token] = hubstub.Token()
        jobs = tmp / "jobs"
        write_test_jobs(jobs, tmp, [str(REPO / "tests" / "standin")])
        fab = Fab(host, tmp, token, jobs, hub)

        first = timed(fab, "train", "--arg", "vars.num_batches=4")
        reruns = [timed(fab, "train", "--arg", "vars.num_batches=4") for _ in range(args.repeat)]

        with_fab = [timed(fab, "convert", "--arg", f"vars.work_dir={tmp}/fab{i}") for i in range(args.repeat)]
        with_ssh = [plain_ssh(fab, tmp / f"ssh{i}") for i in range(args.repeat)]

        big = ("--arg", f"vars.work_dir={tmp}/big", "--arg", f"convert.env.STANDIN_LOG_MB={args.log_mb}")
        known = set((tmp / "state" / "shared").glob("convert-*"))
        runner = fab.start("convert", *big)
        while not (
            new := [
                p
                for p in (tmp / "state" / "shared").glob("convert-*")
                if p not in known and (p / "runner.json").exists()
            ]
        ):
            time.sleep(0.2)
        follower = subprocess.Popen(
            fab.command("logs", "--job", "convert", *big),
            env=fab.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        logs_rss = max_rss_mb(follower)
        train_rss = max_rss_mb(runner)
        log_mb = (new[0] / "log").stat().st_size / 2**20
        server.shutdown()

    median = statistics.median
    print(f"fab train, first run (setup + 3 jobs, stand-ins)     {first:7.2f} s")
    print(
        f"fab train, re-run with everything done (median of {args.repeat}) {median(reruns):7.2f} s   (min {min(reruns):.2f}, max {max(reruns):.2f})"
    )
    print(f"one job through fab convert (median)                 {median(with_fab):7.2f} s")
    print(f"the same job through plain ssh (median)              {median(with_ssh):7.2f} s")
    print(f"overhead fab adds per job                            {median(with_fab) - median(with_ssh):7.2f} s")
    print(f"fab logs following a {log_mb:.0f} MB log: peak RSS        {logs_rss:7.1f} MB")
    print(f"fab convert following the same log: peak RSS          {train_rss:7.1f} MB")


if __name__ == "__main__":
    main()
