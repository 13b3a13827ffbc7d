"""What keeping the environment in the bucket saves a new VM, with the real `fab setup` of the CPU tier.

    .venv/bin/python benchmarks/bench_environment.py [--recover]

On the loopback host with the Cloud Storage emulator as the bucket (tests/gcslayer.py):
1. `fab setup` of the CPU tier's environment (maxtext==0.2.3 and its pinned CPU set, tunix) into a new
   venv with an empty uv cache, as a new VM has it: the build, then its upload to the bucket;
2. a new VM (no state folder, no venv): the same `fab setup` restores it from the bucket; then the restore's
   reading alone (the entry read back and verified, nothing unpacked), and the restored venv copied with
   `cp -a` on the same disk (the files a restore writes, with nothing read from the bucket);
3. with --recover, the real recovery of tests/maxtext_cpu/test_real_loss.py's shape: a run lost after its
   checkpoint of step 2, then `fab train --recover` on a new VM; the time from the command's start to the
   first resumed training step, against the environment's restore plus Orbax's restore of the checkpoint,
   and where that time went (the jobs' runner records and the train log's lines as they came); with
   --cache-on-vm, JAX's compiled programs are kept on the VM and lost with it (base.yml's ~/jax_cache), not
   beside the checkpoints (jobs/train.yaml): the new VM compiles train's programs again.
Prints the times and their ratios. The emulator is in memory on the same machine: a real bucket's speed
is not in these numbers (nor PyPI's: the build downloads from it).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_fab import timed  # noqa: E402  (this folder is on sys.path when run as a script)

from bootstrap.demo import MAKE_INPUTS  # noqa: E402
from bootstrap.remote import envcache, gcs  # noqa: E402
from tests import computestub, gcsemulator, gcslayer  # noqa: E402
from tests.loopback import edit_yaml, loopback_host, wait_for  # noqa: E402
from tests.maxtext_cpu.conftest import HOST_ENV, cpu_fab_at, overrides  # noqa: E402
from tests.stack import INSTANCE, Stack, lose, wipe  # noqa: E402

KEPT = re.compile(r"environment kept in \S+ \(([\d.]+) GiB in \d+ parts, (\d+) s\)")
RESTORED = re.compile(r"environment restored from (\S+) \(([\d.]+) GiB in (\d+) s\)")
CHECKPOINT = re.compile(r"Restored params from step: (\d+) in ([\d.]+) seconds")
RESUMED = re.compile(r"Train step [3-9] training loss")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recover", action="store_true", help="also measure a recovered VM's way to training")
    parser.add_argument("--cache-on-vm", action="store_true", help="with --recover: JAX's cache lost with the VM")
    options = parser.parse_args()
    if options.cache_on_vm and not options.recover:
        parser.error("--cache-on-vm changes only what --recover measures")
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        vm_env = HOST_ENV | {"UV_CACHE_DIR": str(tmp / "uv-cache")}  # a new VM's empty uv cache
        with (
            gcsemulator.emulator(tmp / "emulator.log") as emulator,
            gcslayer.layer(emulator) as url,
            loopback_host(tmp / "sshd", vm_env | gcsemulator.client_env(url)) as host,
            cpu_fab_at(host, tmp / "fab") as fab,
        ):
            os.environ["STORAGE_EMULATOR_HOST"] = url
            venv = fab.tmp / "venv"
            edit_yaml(fab.jobs / "pipeline.yaml", lambda data: data["environment"].update(venv=str(venv)))
            durable = ("--arg", f"vars.durable_dir=gs://{gcsemulator.BUCKET}/{uuid.uuid4().hex[:8]}/model")
            os.sync()  # each timing starts with the disk's earlier writes flushed: none is charged for another's
            built = timed(fab, "setup", *durable)
            log = next((fab.tmp / "state" / "setup").glob("*/log")).read_text()
            size, upload = KEPT.search(log).groups()
            wipe(fab)
            os.sync()
            restored = timed(fab, "setup", *durable)
            log = next((fab.tmp / "state" / "setup").glob("*/log")).read_text()
            entry, _, restore = RESTORED.search(log).groups()
            read_back = read_back_time(entry)
            copied = copy_floor(venv)
            rows = [
                ("environment size", f"{float(size):.2f} GiB"),
                ("fab setup on a new VM, built (empty uv cache)", f"{built:.1f} s, of which {upload} s uploading it"),
                (
                    "fab setup on a new VM, restored from the bucket",
                    f"{restored:.1f} s (the restore itself {restore} s)",
                ),
                ("  restored / built", f"{restored / built:.2f}"),
                ("  of the restore: reading the entry back, every part verified", f"{read_back:.1f} s"),
                ("copying the restored venv on its disk (cp -a)", f"{copied:.1f} s: the files a restore writes"),
                ("  copied / built", f"{copied / built:.2f}"),
            ]
            if options.recover:
                on_vm = ("--arg", "train.jax_cache_dir=${work_dir}/jax-cache") if options.cache_on_vm else ()
                rows += recovered(fab, host, (*durable, *on_vm))
    for what, result in rows:
        print(f"{what:56} {result}")


def read_back_time(entry: str) -> float:
    """The restore's reading alone: every part of the kept entry read and verified as restore reads it
    (envcache's own reader), nothing unpacked."""
    parts = json.loads(gcs.read(f"{entry}/{envcache.MANIFEST}"))["parts"]
    os.sync()
    started = time.perf_counter()
    with ThreadPoolExecutor(envcache.STREAMS) as pool:
        stream = io.BufferedReader(envcache._Verified(entry, parts, pool), envcache.PART_BYTES)
        while stream.read(envcache.PART_BYTES):
            pass
    return time.perf_counter() - started


def copy_floor(venv: Path) -> float:
    """The venv (and the uv Python it runs on, when uv installed it) copied beside it: the files a restore
    writes, with no download, no hashing and no unpacking."""
    python = envcache.python_of(str(venv))["installation"]
    copies = venv.parent / "copies"
    copies.mkdir()
    os.sync()
    started = time.perf_counter()
    subprocess.run(["cp", "-a", str(venv), *([python] if python else []), str(copies)], check=True)
    took = time.perf_counter() - started
    shutil.rmtree(copies)
    return took


def recovered(fab, host, settings: tuple[str, ...]) -> list[tuple[str, str]]:
    """A run lost after its checkpoint of step 2, recovered on a new VM: up to its first resumed step."""
    compute, server = computestub.serve()
    compute.host_keys[INSTANCE] = [tuple(host.host_key.read_text().split()[:2])]
    stack = Stack(fab, compute)
    inputs = fab.tmp / "inputs"
    subprocess.run([fab.tmp / "venv" / "bin" / "python", MAKE_INPUTS, inputs], check=True)
    args = [word for o in overrides(inputs, 6) for word in ("--arg", o)] + [
        *settings,
        "--arg",
        "train.checkpoint_period=2",
    ]
    timed(stack, "train", *args, "--run-name", "lost", "--detach")
    log = fab.job_dir("lost", "train") / "log"

    def train_log() -> str:
        return log.read_text(errors="replace") if log.exists() else ""

    wait_for(lambda: "Train step 3 " in train_log(), 1800)
    lose(fab)
    wipe(fab)
    del compute.instances[INSTANCE]
    stack.unreachable("1001")
    stack.after_up("2002")
    started = time.time()
    recovering = stack.start("train", *args, "--recover")
    wait_for(lambda: CHECKPOINT.search(train_log()), 1800, "the checkpoint's restore")
    restored_at = time.time()
    wait_for(lambda: RESUMED.search(train_log()), 1800, "the first resumed step")
    resumed_at = time.time()
    recovering.communicate(timeout=1800)
    setup = next((fab.tmp / "state" / "setup").glob("*/log")).parent
    validate = next((fab.tmp / "state" / "shared").glob("validate-*"))
    environment = float(RESTORED.search((setup / "log").read_text()).group(3))
    step, checkpoint = CHECKPOINT.findall(train_log())[-1]
    server.shutdown()
    checkpoint_seconds, floor = float(checkpoint), environment + float(checkpoint)
    return [
        ("recovered VM: fab train --recover to its first resumed step", f"{resumed_at - started:.1f} s"),
        (
            f"  environment restore + checkpoint restore (step {step})",
            f"{environment:.0f} s + {checkpoint_seconds:.1f} s",
        ),
        ("  ratio", f"{(resumed_at - started) / floor:.2f}"),
        ("  up to the setup job (the new VM, its startup, fab)", f"{started_at(setup) - started:.1f} s"),
        ("  setup: the environment restored", f"{finished_at(setup) - started_at(setup):.1f} s"),
        (
            "  up to validate, then validate (MaxText's check, JAX)",
            f"{started_at(validate) - finished_at(setup):.1f} s + {finished_at(validate) - started_at(validate):.1f} s",
        ),
        (
            "  from validate's end to train's start, then train_rl's start up to the checkpoint's restore",
            f"{started_at(log.parent) - finished_at(validate):.1f} s"
            f" + {restored_at - checkpoint_seconds - started_at(log.parent):.1f} s",
        ),
        (
            "  the checkpoint restored, then the first resumed step",
            f"{checkpoint_seconds:.1f} s + {resumed_at - restored_at:.1f} s",
        ),
    ]


def started_at(job_dir: Path) -> float:
    """When the job's runner started on the VM (its wall clock, as runner.json records it)."""
    return json.loads((job_dir / "runner.json").read_text())["started"]


def finished_at(job_dir: Path) -> float:
    """When the job ended on the VM (result.json)."""
    return json.loads((job_dir / "result.json").read_text())["finished"]


if __name__ == "__main__":
    main()
