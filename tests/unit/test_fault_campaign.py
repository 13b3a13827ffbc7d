"""Crash safety shown by enumeration: every crash point of the VM side, and reboots, lost VMs and storage
faults at random, each injected into a whole pipeline, which is then driven to its end (tests/campaign.py).

The pipeline is the real driver.py and jobrunner.py as local processes, with the real pipeline's shape:
convert writes a converted model to the bucket, train commits checkpoint steps there (commit_success.txt
last) and resumes from the highest one, export reads ${latest_step:...} and writes SHA256SUMS with the real
manifest tool, the real gcs_upload.py copies it to the bucket (its spec built by publish.gcs_job), and
autostop runs a stand-in shutdown that records what it saw. After each case, at most 3 `fab train`s (the
driver's `start --follow`) must end it, and seven invariants hold (campaign.violations):

    (1) no job ever had two live copies          (2) a job is done only with its latest attempt's outputs, whole
    (3) nothing durable deleted or replaced      (4) the export is the fault-free run's, and so is its copy
    (5) autostop only once every copy verified   (6) `fab train` exits 0 or says why in one line, no traceback
    (7) no job runs again after its durable record says done

The sweep kills the process that reaches each point (driver, runner or tool) at its first hit, after a
prelude where the point needs one (a reboot, a lost VM, a runner killed mid-job); the campaign draws
faults from a seed: kills at any reachable point and hit, a reboot, a lost VM, a killed runner or a
killed `fab train` (the next one attaches) while a job is held at a milestone, and 503s, 429s, dropped
connections (before the request, or after it was done) and answers slower than the client's timeout, at
a chosen request or at random. TPU_RL_CAMPAIGN_SEED=N runs one episode again; TPU_RL_CAMPAIGN_FAULTS=N
runs until N faults were made (200 by default).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bootstrap.remote import faults, manifest
from tests import campaign, gcslayer, hubstub

UNREACHED = {  # points this pipeline never reaches, and why (each is in the AST check all the same)
    "attempts.recorded-on-disk": "the checkpoints, and so the start records, are in the bucket here",
    "hub-upload.wrote-card": "swept below in the plan with the Hub copy (GATE_SWEPT)",
    "hub-upload.uploaded": "swept below in the plan with the Hub copy",
    "hub-upload.wrote-marker": "swept below in the plan with the Hub copy",
    "hub-upload.held": "swept below in the plan with the Hub copy, a worse model than the repository's",
    "export-config.copied-generation-config": "export_config.py reads the Hub; the stand-in export has no such step",
    "export-config.wrote-config": "export_config.py reads the Hub; the stand-in export has no such step",
    "validate.wrote-marker": "MaxText's validator (maxtext_check.py) needs MaxText",
    "copy-down.copied": "fab metrics' copy of the events, not a pipeline job",
    "copy-down.removed": "fab metrics' copy of the events, not a pipeline job",
    "revive.counted": "the crontab's revival of a dead driver: swept in tests/unit/test_driver_process.py",
    "revive.notified": "a driver the crontab gave up on, told once: tests/unit/test_driver_process.py",
    "start.forgot-revivals": "a revival count to forget: swept in tests/unit/test_driver_process.py",
    "envcache.stored": "the setup job's environment in the bucket: swept in tests/unit/test_envcache.py",
    "envcache.removed-old": "swept in tests/unit/test_envcache.py",
    "envcache.moved-into-place": "swept in tests/unit/test_envcache.py",
    "envcache.linked-python": "swept in tests/unit/test_envcache.py",
}
PRELUDES = {  # what must happen before a point is reached at all
    "lost": ("restore.",),  # a new VM takes convert and train as done from their records in the bucket
    "rebooted": ("launch.forgot-", "launch.kept-old-log", "driver.rotated-events"),  # export done, not copied
    "adopting": ("launch.removed-dead-runner",),  # a runner died with its job running
}
LATER_HITS = [  # hits counted across the pipeline's processes: the 2nd runner is train's, the 4th the copy's
    ("driver.saved", 5),
    ("launch.wrote-spec", 4),
    ("run.started-process", 2),
    ("run.process-going", 5),
    ("run.step-ended", 4),
    ("run.wrote-done", 3),
    ("run.recorded-in-bucket", 2),
    ("run.wrote-result", 4),
    ("restore.wrote-done", 2),
]
SWEPT = [(p, 1) for p in faults.POINTS if p not in UNREACHED] + LATER_HITS
KILLABLE = [p for p in faults.POINTS if p not in UNREACHED]
# The publish gate and the Hub copy, in a plan that has them (campaign.Case(hub=...)): each of the Hub upload's
# points, and the eval records the gate judges by (attempts.recorded-in-bucket: the 1st hit is train's start,
# the 2nd its eval before training, the 3rd its eval after), in a better run (8) and a worse one (9).
GATE_SWEPT = [
    ("better", "hub-upload.wrote-card", 1),
    ("better", "hub-upload.uploaded", 1),
    ("better", "hub-upload.uploaded", 3),
    ("better", "hub-upload.wrote-marker", 1),
    ("better", "attempts.recorded-in-bucket", 2),
    ("better", "attempts.recorded-in-bucket", 3),
    ("worse", "hub-upload.wrote-card", 1),
    ("worse", "hub-upload.held", 1),
    ("worse", "attempts.recorded-in-bucket", 3),
]
FAULTS = int(os.environ.get("TPU_RL_CAMPAIGN_FAULTS", "200"))
SEED = os.environ.get("TPU_RL_CAMPAIGN_SEED")
pytestmark = pytest.mark.campaign  # minutes: in the whole suite, not in the quick tier (docs/tests.md)
WORKERS = 2  # episodes side by side: most of a pipeline's time is waiting
SHARDS = 1 if SEED else 4  # the campaign's parts, each a test of its own (test workers run them side by side)


def prelude_of(point: str) -> str:
    return next((name for name, prefixes in PRELUDES.items() if point.startswith(prefixes)), "")


@pytest.fixture(scope="module")
def bucket(gcs_emulator):
    """The layer's URL, and this process's own gcs.py pointed at it (the checks read the bucket)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
        yield gcs_emulator


@pytest.fixture(scope="module")
def reference(bucket, tmp_path_factory) -> dict[str, bytes]:
    """The fault-free run's export, every file of it."""
    case = campaign.Case(tmp_path_factory.mktemp("reference"), bucket, f"ref-{uuid.uuid4().hex[:8]}")
    assert case.drive(calls=1), case.calls[-1].err
    files = campaign.export_files(case.export_dir)
    assert sorted(files) == ["SHA256SUMS", "config.json", "generation_config.json", "model.safetensors"]
    assert campaign.violations(case, files) == []
    return files


@pytest.fixture
def cases(bucket):
    """Cases made in a test, whose processes are all gone after it, however it ended."""
    made: list[campaign.Case] = []

    def new(root, label: str, **extra) -> campaign.Case:
        made.append(campaign.Case(root, bucket, f"{label}-{uuid.uuid4().hex[:8]}", **extra))
        return made[-1]

    yield new
    for case in made:
        case.kill_all()


@pytest.mark.parametrize(("point", "hit"), SWEPT, ids=lambda v: str(v))
def test_a_kill_at_each_point_is_ridden_out(point, hit, cases, reference, tmp_path):
    case = cases(tmp_path, "sweep")
    kill = case.kill_env(f"{point}@{hit}")
    prelude = prelude_of(point)
    if prelude == "lost":
        assert case.drive(calls=1)
        case.reboot(lose_vm=True)
    if prelude == "rebooted":  # while the copy runs: export's outputs are lost, it runs again
        case.reboot_at("copying")
    if prelude == "adopting":  # train's runner killed at its first step: the driver's relaunch adopts train
        case.kill_runner_at("committed-1", **kill)
    else:
        case.call(**kill)
    faulted = {len(case.calls) - 1}
    case.wait_driver_gone()  # the VM left alone after `fab train` (its driver may reach autostop's points)
    ended = case.drive()
    assert case.killed() == [point], f"the kill at {point}@{hit} never happened"
    assert ended, [call.err[-500:] for call in case.calls]
    assert campaign.violations(case, reference, faulted) == []


def test_every_point_is_swept_or_said_why_not():
    assert set(UNREACHED) <= set(faults.POINTS)
    assert {p for p, _ in SWEPT} | set(UNREACHED) == set(faults.POINTS)
    assert {p for p, reason in UNREACHED.items() if "swept below" in reason} <= {p for _, p, _ in GATE_SWEPT}


@pytest.fixture(scope="module")
def hub():
    """The Hub stand-in the cases' gate asks and uploads to (tests/hubstub.py), which knows the campaign's token."""
    state, server = hubstub.serve()
    state.tokens[campaign.TOKEN] = hubstub.Token()
    yield state
    server.shutdown()


@pytest.mark.parametrize(("expect", "point", "hit"), GATE_SWEPT, ids=lambda v: str(v))
def test_a_kill_at_each_point_of_the_gate_and_the_hub_copy_is_ridden_out(expect, point, hit, cases, hub, reference,
                                                                         tmp_path):  # fmt: skip
    case = cases(tmp_path, f"gate-{expect}", hub=expect, hub_state=hub)
    case.call(**case.kill_env(f"{point}@{hit}"))
    case.wait_driver_gone()
    ended = case.drive()
    assert case.killed() == [point], f"the kill at {point}@{hit} never happened"
    assert ended, [call.err[-500:] for call in case.calls]
    assert campaign.violations(case, reference, {0}) == []


@pytest.mark.parametrize("expect", ["better", "worse"])
@pytest.mark.parametrize("lost", [False, True], ids=["reboot", "VM lost"])
@pytest.mark.parametrize("milestone", campaign.GATE_MILESTONES)
def test_a_restart_or_a_lost_vm_between_trains_evals_and_the_gate(milestone, lost, expect, cases, hub, reference,
                                                                   tmp_path):  # fmt: skip
    """Train's log is gone after either (moved aside by the next attempt, or lost with the VM): the gate judges the
    run from the eval records in the bucket. A better model is never held for a lost log (8); a worse one never
    replaces the better model the repository holds (9)."""
    case = cases(tmp_path, f"gate-{expect}", hub=expect, hub_state=hub)
    case.reboot_at(milestone, lose_vm=lost)
    ended = case.drive()
    assert ended, [call.err[-500:] for call in case.calls]
    assert campaign.violations(case, reference, {0}) == []


def episode(seed: int, root, cases, reference) -> tuple[list[str], list[str]]:
    """One pipeline and the faults drawn from `seed`; what was made, and what broke."""
    rng = random.Random(seed)
    case = cases(root / f"seed-{seed}", f"s{seed}")
    made, faulted = [], set()
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.6:
            kinds = gcslayer.FAULTS
            if rng.random() < 0.5:
                schedule = {str(rng.randint(1, 60)): rng.choice(kinds) for _ in range(rng.randint(1, 3))}
                case.arm({"at": schedule})
            else:
                case.arm({"rate": 0.03, "seed": seed, "kinds": list(kinds)})
        kind = rng.choice(["kill", "kill", "kill", "reboot", "lost", "runner", "laptop"])
        milestone = rng.choice(campaign.MILESTONES)
        if kind == "kill":
            point = f"{rng.choice(KILLABLE)}@{rng.choice([1, 1, 2, 3, 4, 5])}"
            before = len(case.killed())
            case.call(**case.kill_env(point))
            made += [f"kill at {point}"] if len(case.killed()) > before else []
        elif kind in ("reboot", "lost"):
            case.reboot_at(milestone, lose_vm=kind == "lost")
            made.append(f"{'VM lost' if kind == 'lost' else 'reboot'} at {milestone}")
        elif kind == "runner":
            case.kill_runner_at(milestone)
            made.append(f"runner killed at {milestone}")
        else:  # the next `fab train` attaches to the pipeline still running
            case.laptop_gone_at(milestone)
            made.append(f"fab train killed at {milestone}")
        faulted.add(len(case.calls) - 1)
        case.arm({})
        if kind != "laptop":
            case.wait_driver_gone()
    made += [f"storage {e['fault']} on {e['name']}" for e in case.journal() if "fault" in e]
    if not case.drive():
        return made, [f"not ended after 3 calls: {[call.err[-300:] for call in case.calls]}"]
    return made, campaign.violations(case, reference, faulted)


@pytest.mark.parametrize("shard", range(SHARDS))
def test_a_seeded_random_campaign_breaks_no_invariant(shard, cases, reference, tmp_path):
    """FAULTS faults in all, in SHARDS parts that test workers run side by side: shard k draws seeds k+1,
    k+1+SHARDS, ... until it made its part."""
    wanted = FAULTS // SHARDS + (shard < FAULTS % SHARDS)  # the shards' parts add up to FAULTS
    started, results = time.monotonic(), []  # (seed, faults made, violations)
    with ThreadPoolExecutor(WORKERS) as pool:
        if SEED:
            results.append((int(SEED), *episode(int(SEED), tmp_path, cases, reference)))
        seed, running = shard + 1 - SHARDS, []
        while not SEED and (sum(len(r[1]) for r in results) < wanted or running):
            while len(running) < WORKERS and sum(len(r[1]) for r in results) + 2 * len(running) < wanted:
                seed += SHARDS
                running.append((seed, pool.submit(episode, seed, tmp_path, cases, reference)))
            number, future = running.pop(0)
            results.append((number, *future.result()))
            if results[-1][2]:  # said at once: a long campaign shows what it found as it goes
                print(f"seed {number}: {results[-1][1]}: {results[-1][2]}", flush=True)
    total = sum(len(made) for _, made, _ in results)
    print(f"{total} faults in {len(results)} episodes, {time.monotonic() - started:.0f} s")
    broken = [f"seed {n} (TPU_RL_CAMPAIGN_SEED={n}): {made}: {found}" for n, made, found in results if found]
    assert broken == [], "\n".join(broken)
    assert SEED or (total >= wanted and (total > 0 or FAULTS < SHARDS))


def test_a_broken_trainer_is_caught(cases, reference, tmp_path):
    """The checks can fail: a trainer that ignores its committed steps and starts again from the converted
    model rewrites committed steps after a reboot, which (3) finds."""
    case = cases(tmp_path, "broken", broken="restart")
    case.reboot_at("committed-2")
    assert case.drive()
    found = campaign.violations(case, reference, {0})
    assert any(line.startswith("(3)") for line in found), found


def test_a_driver_killed_after_saving_its_end_does_not_leave_fab_train_streaming(cases, reference, tmp_path):
    """Found by the campaign (seed 81: a kill at driver.saved@2): follow ended only on `finished` or an
    interrupted pipeline, so `fab train` streamed forever; it now ends with the end the driver saved."""
    case = cases(tmp_path, "hang")
    assert case.drive(calls=1)
    case.call(**case.kill_env("driver.saved@2"))  # a pass with every job done: saved at its start, then its end
    assert case.killed() == ["driver.saved"]
    assert not case.calls[-1].hung, "fab train was still streaming 15 s after its driver was gone"


def test_an_export_planted_after_a_restart_is_never_taken_nor_copied(cases, reference, tmp_path):
    """The review's HIGH as a fault: the run is done and copied; a restart empties /dev/shm; something else writes
    an export of its own (its SHA256SUMS and all) where the run's was. The export job's seal no longer holds, so
    the next pass makes the export again from the bucket's checkpoints; the planted weights reach no copy and
    every invariant holds."""
    case = cases(tmp_path, "planted")
    assert case.drive(), case.calls[-1].err
    case.reboot()
    planted = Path(case.export_dir)
    planted.mkdir(parents=True)
    for name, data in reference.items():
        (planted / name).write_bytes(b"planted weights" if name == "model.safetensors" else data)
    manifest.write(str(planted))
    assert case.drive(), case.calls[-1].err
    assert campaign.export_files(case.export_dir) == reference
    assert campaign.violations(case, reference, {len(case.calls) - 1}) == []
