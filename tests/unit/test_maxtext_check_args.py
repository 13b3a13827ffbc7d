"""maxtext_check.py's two forms of arguments (the MaxText tier checks every rejection through the --job form)."""

from __future__ import annotations

from bootstrap.remote import maxtext_check

TRAIN_RL = "maxtext.trainers.post_train.rl.train_rl"


def test_a_lone_module_is_one_job_named_after_it():
    assert maxtext_check._jobs([TRAIN_RL, "a=1", "b=2"]) == [("train_rl", TRAIN_RL, ["a=1", "b=2"])]


def test_job_groups_are_one_job_each_in_order():
    words = ["--job", "x", TRAIN_RL, "a=1", "--job", "y", TRAIN_RL]
    assert maxtext_check._jobs(words) == [("x", TRAIN_RL, ["a=1"]), ("y", TRAIN_RL, [])]
