"""fab train --watch's loop (vm/recovery.py): a lost VM is recovered a bounded number of times, each wait twice the
last, each try said and told; anything else ends it at once. (The whole of it, a VM deleted mid-train: the SSH
tier's tests/ssh/test_recover.py.)"""

from __future__ import annotations

import pytest

from bootstrap.errors import UserError, VmUnavailable
from bootstrap.vm import recovery


class Attempts:
    """Each call fails with the next of `outcomes` (None: the run finishes); `reaching`: the calls (0 the first)
    that moved the run on (trained a step) before they failed."""

    def __init__(self, *outcomes, reaching: tuple[int, ...] = ()):
        self.outcomes, self.recovering, self.reaching = list(outcomes), [], reaching

    def __call__(self, recovering: bool, progressed) -> None:
        if len(self.recovering) in self.reaching:
            progressed()
        self.recovering.append(recovering)
        if outcome := self.outcomes.pop(0):
            raise outcome


def watched(attempts: Attempts, tries: int) -> tuple[list[str], list[dict], list[float]]:
    said, told, slept = [], [], []
    recovery.watch(attempts, tries, said.append, lambda text, event: told.append({**event, "text": text}), slept.append)
    return said, told, slept


def test_a_lost_vm_is_recovered_with_waits_that_double_until_the_run_finishes(monkeypatch):
    monkeypatch.setattr(recovery, "FIRST_WAIT_SECONDS", 60.0)
    attempts = Attempts(VmUnavailable("lost the connection"), VmUnavailable("`pulumi up` failed"), None)
    said, told, slept = watched(attempts, tries=5)
    assert attempts.recovering == [False, True, True]  # the first as asked, then as `fab train --recover`
    assert slept == [60.0, 120.0]
    assert said == [
        "the VM cannot carry the run on (lost the connection); recovery 1 of 5 in 60 s",
        "the VM cannot carry the run on (`pulumi up` failed); recovery 2 of 5 in 120 s",
    ]
    assert [(t["state"], t["recovery"]) for t in told] == [("recovering", 1), ("recovering", 2)]


def test_a_recovery_that_got_the_run_going_starts_the_count_afresh_at_the_next_loss(monkeypatch):
    """Hours later another preemption: a long Spot run is not given up after its --tries-th preemption."""
    monkeypatch.setattr(recovery, "FIRST_WAIT_SECONDS", 60.0)
    lost = [VmUnavailable(f"preempted {n}") for n in range(4)]
    attempts = Attempts(*lost, None, reaching=(0, 1, 2, 3))  # each recovery resumed the run, then it was lost again
    said, _, slept = watched(attempts, tries=2)
    assert slept == [60.0] * 4 and all("recovery 1 of 2" in line for line in said)


def test_new_vms_lost_before_the_run_moves_stay_bounded_by_tries_after_one_that_got_going(monkeypatch):
    """The first VM trained, then each new one answered SSH and was lost before it trained a step: those recoveries
    are counted, and the watch gives up after --tries of them rather than pay for VMs without end."""
    monkeypatch.setattr(recovery, "FIRST_WAIT_SECONDS", 60.0)
    attempts = Attempts(*(VmUnavailable(f"lost {n}") for n in range(10)), reaching=(0,))
    with pytest.raises(UserError, match="gave up after 3 recoveries"):
        watched(attempts, tries=3)
    assert len(attempts.recovering) == 4  # the first VM, then three recoveries that never moved the run


def test_a_loss_says_the_preemption_the_vm_recorded_since_the_attempt_began_without_advice_to_run_fab(monkeypatch):
    """The watch says why the VM went (the shutdown script's record), and never tells the user to run fab train
    --recover or --run-name: it is doing that itself."""
    monkeypatch.setattr(recovery, "FIRST_WAIT_SECONDS", 1.0)
    lost = VmUnavailable("lost the connection to vm while watching", ". Watch it again: fab train --run-name r1")
    asked = []

    def preempted(since: float) -> str:
        asked.append(since)
        return "preempted on 2026-12-05 at 10:00 UTC during train (last committed checkpoint: step 4)"

    said = []
    recovery.watch(Attempts(lost, None), 3, said.append, lambda text, event: None, lambda s: None, preempted)
    assert said == [
        "the VM cannot carry the run on (lost the connection to vm while watching; it was preempted on 2026-12-05 at "
        "10:00 UTC during train (last committed checkpoint: step 4)); recovery 1 of 3 in 1 s"
    ]
    assert len(asked) == 1 and asked[0] > 1.7e9  # since the attempt began


def test_the_waits_stop_growing_at_half_an_hour(monkeypatch):
    monkeypatch.setattr(recovery, "FIRST_WAIT_SECONDS", 60.0)
    assert [recovery.wait_before(n) for n in (1, 5, 6, 9)] == [60.0, 960.0, 1800.0, 1800.0]


def test_after_its_tries_it_gives_up_in_one_line_and_tells_so():
    attempts = Attempts(*(VmUnavailable("no Spot capacity") for _ in range(3)))
    said, told = [], []
    with pytest.raises(UserError) as raised:
        recovery.watch(attempts, 2, said.append, lambda text, event: told.append(event), lambda seconds: None)
    assert str(raised.value) == "no Spot capacity; fab train --watch gave up after 2 recoveries (--tries)"
    assert not isinstance(raised.value, VmUnavailable) and len(attempts.recovering) == 3
    assert told[-1] == {"state": "gave-up", "recoveries": 2}


def test_anything_but_a_lost_vm_ends_the_watch_at_once():
    failed = UserError("train failed: see fab logs --job train")
    attempts = Attempts(failed)
    with pytest.raises(UserError) as raised:
        watched(attempts, tries=5)
    assert raised.value is failed and attempts.recovering == [False]
