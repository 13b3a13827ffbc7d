"""Measure fab against the loopback SSH host (stand-in jobs): the numbers issue 8 asks for.

    .venv/bin/python benchmarks/bench_fab.py [--repeat 5] [--seconds 20] [--log-mb 200]

1. a fresh `fab train` whose setup and prefetch each take --seconds: its wall time against the
   longer of the two plus the rest (the graph runs them side by side) and against their sum; and
   the gaps on the VM between a job's end and the start of the job that needs it (the runners' times);
2. `fab train` re-run with everything done, as a ratio to a plain `ssh host true` timed in the same run,
   and the Hub requests it made; `fab status` as the same ratio; and a bare Fabric connection running
   `true` (Python, Fabric's imports, paramiko's handshake): the floor of any tool built on Fabric;
3. the time fab adds to one job: `fab convert` against a plain `ssh host 'python -m ...'` running the
   same stand-in job with the same arguments;
4. the peak memory (max RSS) of `fab logs` following a job that writes a --log-mb log.
Needs what the SSH tests need (sshd, uv, a Python 3.12). Prints a small table.

    .venv/bin/python benchmarks/bench_fab.py --fixed-cost [--repeat 15]

measures only fab's fixed cost, side by side in one loop: a no-op `fab train` and `fab status` against a plain
`ssh host true` (each round runs all three), and where the time goes: the interpreter's start, fab's imports and
its task collection (`fab --list`, no connection), a bare Fabric connection running `true`.

    .venv/bin/python benchmarks/bench_fab.py --against DIR [--repeat 15]

measures 2 and 3 side by side instead: this tree's fab and the one in DIR (another revision's checkout,
e.g. `git worktree add DIR REV`), each with its own state folder on the same loopback host, their commands
interleaved, so that both pay what the machine costs at that moment; --hf-login gives both fabs the token as
`hf auth login` stores it (a file in the Hugging Face home) instead of in HF_TOKEN.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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

from bootstrap import secrets  # noqa: E402
from bootstrap.jobs import load  # noqa: E402
from bootstrap.jobs.load import render, resolve  # noqa: E402
from tests import hubstub  # noqa: E402
from tests.loopback import REPO, Fab, Host, edit_yaml, loopback_host, write_test_jobs  # noqa: E402


def timed(fab: Fab, *args: str) -> float:
    started = time.perf_counter()
    result = fab(*args, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"fab {' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return time.perf_counter() - started


def wall(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Seconds a command takes to its end, its output dropped; it must succeed."""
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - started


def ssh(fab: Fab, command: str) -> float:
    """A plain OpenSSH client running `command`: the floor any remote tool stands on."""
    host = fab.host
    argv = ["ssh", "-q", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-i", str(host.key)]
    return wall([*argv, "-p", str(host.port), f"{host.user}@127.0.0.1", command])


def bare_fabric(fab: Fab) -> float:
    """A Python process that imports Fabric, connects and runs `true`: the floor of any tool built on Fabric."""
    host = fab.host
    program = (
        "import sys; from fabric import Connection; "
        "Connection('127.0.0.1', user=sys.argv[1], port=int(sys.argv[2]), connect_kwargs={'key_filename': sys.argv[3]})"
        ".run('true', hide=True)"
    )
    return wall([sys.executable, "-c", program, host.user, str(host.port), str(host.key)])


def plain_convert(fab: Fab, work_dir: Path) -> float:
    """The convert stand-in run with a bare ssh command: no state, no detach, no checks."""
    files = load.read(fab.jobs)
    job = next(j for j in render(resolve(files, [f"vars.work_dir={work_dir}"])) if j.name == "convert")
    argv = [str(fab.tmp / "venv" / "bin" / "python3"), *job.argv[1:]]
    token_file = fab.tmp / "state" / "secrets" / "HF_TOKEN"
    return ssh(fab, f"HF_TOKEN=$(cat {token_file}) {shlex.join(argv)} >/dev/null 2>&1")


def job_times(fab: Fab) -> dict[str, dict]:
    """Each job's start and end on the VM, from the local run record (the runners' timestamps)."""
    run = (fab.tmp / "state" / "current-run").read_text().strip()
    return json.loads((fab.tmp / "runs" / run / "record.json").read_text())["jobs"]


def durations(times: dict[str, dict]) -> dict[str, float]:
    return {name: info["finished"] - info["started"] for name, info in times.items()}


def gaps(times: dict[str, dict]) -> dict[str, float]:
    """For each job of the chain, the time from the end of the last job it needs to its own start."""
    needs = {"convert": ("setup", "prefetch"), "train": ("convert",), "export": ("train",)}
    return {
        f"{'+'.join(before)} -> {job}": times[job]["started"] - max(times[n]["finished"] for n in before)
        for job, before in needs.items()
    }


def max_rss_mb(process: subprocess.Popen) -> float:
    _, _, usage = os.wait4(process.pid, 0)
    process.returncode = 0
    return usage.ru_maxrss / 1024


def slow_setup_and_prefetch(fab: Fab, seconds: int) -> None:
    edit_yaml(fab.jobs / "pipeline.yaml", lambda d: d["environment"].update(post_install=[f"sleep {seconds}"]))
    edit_yaml(
        fab.jobs / "prefetch.yaml",
        lambda d: d.update(command=["sh", "-c", f'sleep {seconds} && exec "$@"', "sh", *d["command"]]),
    )


@dataclasses.dataclass
class OtherFab(Fab):
    """fab of another checkout (`tree`), with this tree's test harness."""

    tree: Path = REPO
    hf_login: bool = False  # the token as `hf auth login` stores it, not in HF_TOKEN

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hf_login:
            (self.home / ".cache" / "huggingface").mkdir(parents=True, exist_ok=True)
            (self.home / ".cache" / "huggingface" / "token").write_text(self.token)

    def env(self) -> dict[str, str]:
        env = super().env()
        if self.hf_login:
            for name in (*secrets.HUB_TOKEN_SETTINGS, *secrets.HUB_TOKEN_ELSEWHERE):
                env.pop(name, None)
        return env

    def command(self, *args: str) -> list[str]:
        argv = super().command(*args)
        argv[argv.index(str(REPO))] = str(self.tree)
        return argv


def side_by_side(host: Host, hub: hubstub.Hub, token: str, tmp: Path, other: Path, repeat: int, hf_login: bool) -> None:
    """The no-op, status and one-job rows for this tree and `other`, interleaved; medians and ratios."""
    fabs = {}
    for name, tree in (("this tree", REPO), (str(other), other)):
        folder = tmp / ("this" if tree == REPO else "other")
        write_test_jobs(folder / "jobs", folder, [str(REPO / "tests" / "standin")])
        fabs[name] = OtherFab(host, folder, token, folder / "jobs", hub, tree=tree, hf_login=hf_login)
        timed(fabs[name], "train", "--arg", "vars.num_batches=4")
    times: dict[str, list[float]] = {"ssh true": [], "plain ssh job": []}
    for _ in range(repeat):  # the no-ops first: a convert hands the driver another plan
        for name, fab in fabs.items():
            times.setdefault(f"{name}: no-op", []).append(timed(fab, "train", "--arg", "vars.num_batches=4"))
            times.setdefault(f"{name}: status", []).append(timed(fab, "status", "--arg", "vars.num_batches=4"))
            times["ssh true"].append(ssh(fab, "true"))
    for round_ in range(repeat):
        for name, fab in fabs.items():
            convert = timed(fab, "convert", "--arg", f"vars.work_dir={fab.tmp}/convert{round_}")
            times.setdefault(f"{name}: one job", []).append(convert)
        times["plain ssh job"].append(plain_convert(fabs["this tree"], tmp / f"ssh{round_}"))
    median = {what: statistics.median(values) for what, values in times.items()}
    print(f"plain `ssh host true` {median['ssh true']:.3f} s, the job over plain ssh {median['plain ssh job']:.3f} s")
    for name in fabs:
        noop, status, job = (median[f"{name}: {what}"] for what in ("no-op", "status", "one job"))
        true = median["ssh true"]
        print(
            f"{name}: no-op {noop:.3f} s ({noop / true:.2f}x), status {status:.3f} s ({status / true:.2f}x), "
            f"one job +{job - median['plain ssh job']:.3f} s"
        )


def fixed_cost(fab: Fab, repeat: int) -> None:
    """A no-op fab train and fab status beside ssh true, interleaved so each round pays the machine's cost of that
    moment; then what a no-op is made of."""
    args = ("--arg", "vars.num_batches=4")
    timed(fab, "train", *args)  # everything done from here on
    rounds: dict[str, list[float]] = {name: [] for name in ("ssh", "train", "status", "python", "list", "fabric")}
    for _ in range(repeat):
        rounds["ssh"].append(ssh(fab, "true"))
        rounds["train"].append(timed(fab, "train", *args))
        rounds["status"].append(timed(fab, "status", *args))
        rounds["python"].append(wall([sys.executable, "-c", "pass"]))
        rounds["list"].append(wall(fab.command("--list"), fab.env()))
        rounds["fabric"].append(bare_fabric(fab))
    median = {name: statistics.median(values) for name, values in rounds.items()}
    base = median["ssh"]
    print(f"medians of {repeat} rounds; each round ran every line once")
    for name, what in (
        ("ssh", "plain `ssh host true`"),
        ("train", "fab train, everything done"),
        ("status", "fab status"),
        ("python", "  of which: Python's start"),
        ("list", "  of which: Python, fab's imports and its tasks (fab --list, no connection)"),
        ("fabric", "  of which: a bare Fabric connection running `true` (Python, imports, handshake)"),
    ):
        print(f"{what:<80}{median[name]:6.3f} s {median[name] / base:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--log-mb", type=int, default=200)
    parser.add_argument("--against", type=Path, help="another checkout: its fab and this tree's, side by side")
    parser.add_argument("--hf-login", action="store_true", help="with --against: the token from `hf auth login`")
    parser.add_argument("--fixed-cost", action="store_true", help="only a no-op fab train and status against ssh")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, loopback_host(Path(directory) / "sshd") as host:
        tmp = Path(directory)
        hub, server = hubstub.serve()
        token = "hf_bench" + uuid.uuid4().hex
        hub.tokens[token] = hubstub.Token()
        if args.against:
            side_by_side(host, hub, token, tmp, args.against.resolve(), args.repeat, args.hf_login)
            server.shutdown()
            return
        jobs = tmp / "jobs"
        write_test_jobs(jobs, tmp, [str(REPO / "tests" / "standin")])
        if args.fixed_cost:
            fixed_cost(Fab(host, tmp, token, jobs, hub), args.repeat)
            server.shutdown()
            return
        slow_setup_and_prefetch(Fab(host, tmp, token, jobs, hub), args.seconds)
        fab = Fab(host, tmp, token, jobs, hub)

        first = timed(fab, "train", "--arg", "vars.num_batches=4")
        times = job_times(fab)
        took, waits = durations(times), gaps(times)
        rest = sum(took[job] for job in ("convert", "train", "export"))
        reruns, trues, floors, statuses = [], [], [], []
        hub.requests.clear()
        for _ in range(args.repeat):
            reruns.append(timed(fab, "train", "--arg", "vars.num_batches=4"))
            trues.append(ssh(fab, "true"))
            floors.append(bare_fabric(fab))
        noop_requests = len(hub.requests) / args.repeat
        for _ in range(args.repeat):
            statuses.append(timed(fab, "status", "--arg", "vars.num_batches=4"))

        with_fab = [timed(fab, "convert", "--arg", f"vars.work_dir={tmp}/fab{i}") for i in range(args.repeat)]
        with_ssh = [plain_convert(fab, tmp / f"ssh{i}") for i in range(args.repeat)]

        big = ("--arg", f"vars.work_dir={tmp}/big", "--arg", f"convert.env.STANDIN_LOG_MB={args.log_mb}")
        known = set((tmp / "state" / "shared").glob("convert-*"))
        runner = fab.start("convert", *big)
        while not [
            p for p in (tmp / "state" / "shared").glob("convert-*") if p not in known and (p / "runner.json").exists()
        ]:
            time.sleep(0.2)
        follower = subprocess.Popen(
            fab.command("logs", "--job", "convert", *big),
            env=fab.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        logs_rss = max_rss_mb(follower)
        max_rss_mb(runner)
        server.shutdown()

    median = statistics.median
    print(f"fresh fab train, setup {took['setup']:.1f} s and prefetch {took['prefetch']:.1f} s  {first:7.2f} s")
    print(
        f"  as a ratio to the longer of the two plus the rest               {first / (max(took['setup'], took['prefetch']) + rest):7.2f}"
    )
    print(
        f"  as a ratio to their sum plus the rest                           {first / (took['setup'] + took['prefetch'] + rest):7.2f}"
    )
    for link, seconds in waits.items():
        print(f"  gap on the VM between {link:<38}{seconds:7.2f} s")
    print(f"fab train re-run, everything done (median of {args.repeat})                 {median(reruns):7.2f} s")
    print(f"plain `ssh host true` (median)                                    {median(trues):7.2f} s")
    print(f"  re-run as a ratio to ssh true                                   {median(reruns) / median(trues):7.2f}")
    print(f"  Hub requests made by one re-run                                 {noop_requests:7.1f}")
    print(f"a bare Fabric connection running `true` (median)                  {median(floors):7.2f} s")
    print(f"  as a ratio to ssh true: any Fabric tool's floor                 {median(floors) / median(trues):7.2f}")
    print(f"fab status (median)                                               {median(statuses):7.2f} s")
    print(f"  as a ratio to ssh true                                          {median(statuses) / median(trues):7.2f}")
    print(f"one job through fab convert (median)                              {median(with_fab):7.2f} s")
    print(f"the same job through plain ssh (median)                           {median(with_ssh):7.2f} s")
    print(
        f"  overhead fab adds per job                                       {median(with_fab) - median(with_ssh):7.2f} s"
    )
    print(f"fab logs following a {args.log_mb} MB log: peak RSS                        {logs_rss:7.1f} MB")


if __name__ == "__main__":
    main()
