"""The run's result from the evals MaxText logged: one line with the change and its 95% interval, and the
warnings a practitioner would give, the same in fab's output, summary.json and the model card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootstrap.remote import attempts, eval_recorder, evals, hub_upload
from bootstrap.results import metrics
from bootstrap.results.runs import RunRecord
from bootstrap.vm.progress import result_lines

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def line(phase: str, correct: int, total: int, fmt: float, reward: float = 0.5) -> str:
    """An eval line exactly as train_rl.py and tunix's hooks log it (tests/fixtures/logs/train.log)."""
    accuracy = 100 * correct / total
    return (
        f"W1130 21:04:06.730518 140248714398592 train_rl.py:716] {phase}: corr={correct}, total={total}, "
        f"accuracy={accuracy:.1f}%, partial_accuracy={accuracy:.1f}%, format_accuracy={fmt:.1f}%, mean_reward={reward:.4f}"
    )


def from_lines(tmp_path, *lines: str) -> list[dict]:
    log = tmp_path / "log"
    log.write_text("\n".join(lines) + "\n")
    return evals.from_log(str(log), total_steps=50)


def test_the_recorded_real_log_gives_its_own_numbers_and_says_two_problems_cannot_judge():
    found = evals.from_log(str(LOGS / "train.log"), total_steps=4)
    result = evals.outcome(found)
    assert (result["before"], result["after"], result["problems"]) == (0.0, 0.0, 2)  # the log's own numbers
    assert evals.result_line(result) == (
        f"GSM8K accuracy 0.0% -> 0.0% (+0.0 points, 95% interval +-{result['interval']:.1f}) on 2 held-out problems; "
        f"format 0% -> 0%; too few problems to tell this change from noise (+-{result['interval']:.1f} points)"
    )
    assert result["interval"] > 50 and not result["judged"] and evals.warnings(result) == []


def test_a_healthy_run_on_the_whole_test_split(tmp_path):
    found = from_lines(tmp_path, line("Pre RL Training", 636, 1319, 71), line("Post RL Training", 811, 1319, 98))
    assert result_lines(found) == [
        "result: GSM8K accuracy 48.2% -> 61.5% (+13.3 points, 95% interval +-3.8) on 1,319 held-out problems; "
        "format 71% -> 98%"
    ]


def test_a_format_learned_instead_of_the_task_is_said_with_its_numbers(tmp_path):
    found = from_lines(tmp_path, line("Pre RL Training", 636, 1319, 40), line("Post RL Training", 640, 1319, 97))
    assert result_lines(found)[1:] == [
        "warning: format accuracy rose 40% -> 97% while accuracy did not (48.2% -> 48.5%): the model learned the "
        "answer format, not the task"
    ]


def test_a_worse_model_is_said_and_a_small_drop_is_only_noise(tmp_path):
    worse = from_lines(tmp_path, line("Pre RL Training", 636, 1319, 71), line("Post RL Training", 500, 1319, 71))
    assert result_lines(worse)[1:] == [
        "warning: accuracy fell 48.2% -> 37.9% (-10.3 points, beyond the +-3.8 of noise): this model is worse than "
        "the one it was trained from"
    ]
    noise = from_lines(tmp_path, line("Pre RL Training", 636, 1319, 71), line("Post RL Training", 630, 1319, 71))
    assert len(result_lines(noise)) == 1 and "too few problems to tell this change from noise" in result_lines(noise)[0]


def test_a_resumed_run_is_compared_with_the_first_attempts_base_model_not_the_restored_weights(tmp_path):
    found = from_lines(
        tmp_path,
        line("Pre RL Training", 100, 200, 50),  # the base model, first attempt
        "I1130 tunix restore: Restored params from step: 20 in 1.7 seconds",
        line("Pre RL Training", 150, 200, 90),  # the second attempt's eval of the restored weights
        line("Post RL Training", 160, 200, 95),
    )
    result = evals.outcome(found)
    assert (result["before"], result["after"], result["change"]) == (50.0, 80.0, 30.0)
    resumed = [line for line in result_lines(found) if line.startswith("resumed at step 20: ")]
    assert len(resumed) == 1 and "completions after it sampled anew" in resumed[0]  # what the resume changed
    unseen_start = [e for e in found if e["phase"] != "pre"]  # a run started with --detach: no eval before
    assert [line for line in result_lines(unseen_start) if line.startswith("resumed at step 20: ")] == resumed
    never_stopped = from_lines(tmp_path, line("Pre RL Training", 100, 200, 50), line("Post RL Training", 160, 200, 95))
    assert not [line for line in result_lines(never_stopped) if "resumed" in line]


def test_no_result_without_an_eval_before_and_after():
    assert evals.outcome([]) is None and result_lines([]) == []
    assert evals.card_result([]) == (
        "Not judged: no held-out eval was recorded for this run (train.num_test_batches: 0 evaluates nothing)."
    )


@pytest.mark.parametrize("where", ["summary", "card"])
def test_the_summary_and_the_card_carry_the_same_numbers(tmp_path, where):
    found = from_lines(tmp_path, line("Pre RL Training", 636, 1319, 40), line("Post RL Training", 640, 1319, 97))
    expected = evals.result_line(evals.outcome(found))
    if where == "summary":
        record = RunRecord(name="r1", evals=found)
        summary = metrics.summarize(record, tmp_path / "summary.json", {})
        assert json.loads((tmp_path / "summary.json").read_text())["result"]["line"] == expected
        assert summary["warnings"] == evals.warnings(evals.outcome(found)) and len(summary["warnings"]) == 1
    else:
        template = tmp_path / "card.template.md"
        template.write_text(f"# card\n\n{evals.CARD_RESULT}\n\n| eval |\n{evals.CARD_ROWS}\n")
        card = Path(hub_upload.write_card(str(template), found)).read_text()
        assert f"**Result:** {expected}." in card and "**Warning:** format accuracy rose 40% -> 97%" in card
        assert evals.CARD_RESULT not in card and evals.CARD_ROWS not in card


@pytest.mark.parametrize(
    ("rule", "before", "after", "held"),
    [
        ("improved", 636, 811, None),  # +13.3 points, beyond +-3.8
        ("improved", 636, 640, "publish_if: improved, and it did not: GSM8K accuracy 48.2% -> 48.5%"),  # noise
        ("improved", 636, 500, "publish_if: improved, and it did not: GSM8K accuracy 48.2% -> 37.9%"),  # worse
        ("always", 636, 500, None),
        ("55", 636, 811, None),
        ("55", 636, 700, "publish_if: 55% accuracy, and it reached 53.1%"),
    ],
)
def test_the_publish_gate(tmp_path, rule, before, after, held):
    found = from_lines(tmp_path, line("Pre RL Training", before, 1319, 71), line("Post RL Training", after, 1319, 90))
    why = evals.held_back(found, rule)
    assert why == held if held is None else why.startswith(held)


def test_an_eval_of_sampled_passes_is_read_too():
    """With eval_mode pass_at_1, MaxText averages its passes and prints `corr` as a float (seen on the TPU tier's
    run): such a line was not read at all, so a run evaluated that way had no result and was always held back."""
    line = (
        "W1204 05:40:55.872671 140438024190848 train_rl.py:754] Post RL Training: corr=11.25, total=64, "
        "accuracy=17.578125%, partial_accuracy=17.578125%, format_accuracy=78.125%, mean_reward=0.7402"
    )
    assert evals.parse(line) == {
        "phase": "post", "step": None, "corr": 11.25, "total": 64.0, "accuracy": 17.578125,
        "partial_accuracy": 17.578125, "format_accuracy": 78.125, "mean_reward": 0.7402,
    }  # fmt: skip


def test_no_evals_never_pass_an_improved_gate_silently():
    assert evals.held_back([], "improved").startswith("no held-out eval was recorded for this run")
    assert evals.held_back([], "always") is None


def test_an_eval_that_is_really_gone_is_named_in_the_reason(tmp_path):
    resumed = from_lines(
        tmp_path, "Restored params from step: 20 in 0.5 seconds", line("Pre RL Training", 700, 1319, 90),
        line("Post RL Training", 811, 1319, 95),
    )  # fmt: skip
    assert evals.held_back(resumed, "improved") == (
        "the eval of the model before training is not among this run's records (it was never recorded), so "
        "publish_if: improved cannot be judged"
    )


def test_the_gate_reads_the_evals_each_attempt_recorded_as_it_logged_them(tmp_path):
    """What the launcher's recorder keeps (eval_recorder.EvalRecorder) judges the run: the first attempt's eval before
    training, the resumed attempt's evals after it, whichever log is gone; a half-written record is left out."""
    folder = tmp_path / "evals"
    first = eval_recorder.EvalRecorder(str(folder))
    first.read(line("Pre RL Training", 636, 1319, 71))
    first.read(line("Intermediate Eval (step=10)", 700, 1319, 80))
    second = eval_recorder.EvalRecorder(str(folder))  # a new attempt, on a new VM: it resumes from step 10
    second.read("I1203 10:00:00.000 1 checkpoint_manager.py:235] Restored params from step: 10 in 0.6 seconds")
    second.read(line("Pre RL Training", 700, 1319, 80))
    second.read(line("Post RL Training", 811, 1319, 97))
    (folder / "0-half.json").write_text('{"phase": "pre", "accu')
    found = attempts.recorded_evals(attempts.read_records(str(folder)), total_steps=50)
    phases = [(e["phase"], e["step"]) for e in found]
    assert phases == [("pre", None), ("intermediate", 10), ("resumed", 10), ("post", None)]
    assert evals.held_back(found, "improved") is None and evals.outcome(found)["before"] == 48.2  # the line says .1f


def test_most_steps_without_reward_spread_are_said_and_a_healthy_run_is_quiet():
    def series(spreads: list[float]) -> dict:
        return {
            "rewards/train/score/max": {step: 1.0 for step in range(1, len(spreads) + 1)},
            "rewards/train/score/min": {step: 1.0 - s for step, s in enumerate(spreads, 1)},
        }

    assert metrics.flat_rewards(series([0, 0, 0.5, 0])) == (
        "every completion scored alike at 3 of 4 steps (reward spread zero): GRPO had no learning signal there; "
        "more rl.num_generations or a reward with partial credit gives it one"
    )
    assert metrics.flat_rewards(series([0.5, 0, 0.5, 0.25])) is None and metrics.flat_rewards({}) is None


GOOD_EVAL = {"phase": "post", "step": None, "corr": 3, "total": 4, "accuracy": 75.0, "partial_accuracy": 75.0,
             "format_accuracy": 100.0, "mean_reward": 0.5}  # fmt: skip


@pytest.mark.parametrize(
    "damage",
    [{"accuracy": float("nan")}, {"mean_reward": float("inf")}, {"total": 0}, {"phase": "later"}, {"step": "10"},
     {"corr": "3"}, {"accuracy": None}],
)  # fmt: skip
def test_a_recorded_eval_that_is_not_as_parse_makes_it_is_never_read(damage):
    """A record in a folder that is not ours alone: one that no eval line could have made judges nothing."""
    assert evals.valid(GOOD_EVAL) and not evals.valid({**GOOD_EVAL, **damage})
    recorded = [json.dumps({**GOOD_EVAL, "recorded": 1.0}), json.dumps({**GOOD_EVAL, **damage, "recorded": 2.0})]
    assert attempts.recorded_evals(recorded, None) == attempts.recorded_evals(recorded[:1], None)
