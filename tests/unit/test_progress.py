"""Progress from the real log line formats (workload.md section 6), on a terminal and off it."""

import io

from rich.console import Console

from bootstrap.progress import JobProgress, eval_table, parse
from bootstrap.vm import _lines

PRE = "I1130 12:00:00.000000 140 train_rl.py:650] Pre RL Training: corr=31, total=80, accuracy=38.75%, partial_accuracy=41.25%, format_accuracy=62.50%, mean_reward=-0.1250"
MID = "I1130 12:05:00.000000 140 train_rl.py:700] Intermediate Eval (step=10): corr=40, total=80, accuracy=50.00%, partial_accuracy=52.50%, format_accuracy=80.00%, mean_reward=0.7500"
POST = "Post RL Training: corr=52, total=80, accuracy=65.00%, partial_accuracy=66.25%, format_accuracy=95.00%, mean_reward=1.5000"


def test_eval_lines():
    pre, mid, post = parse(PRE).eval, parse(MID).eval, parse(POST).eval
    assert pre == {
        "phase": "pre",
        "step": None,
        "corr": 31,
        "total": 80,
        "accuracy": 38.75,
        "partial_accuracy": 41.25,
        "format_accuracy": 62.5,
        "mean_reward": -0.125,
    }
    assert (mid["phase"], mid["step"], mid["accuracy"]) == ("intermediate", 10, 50.0)
    assert (post["phase"], post["mean_reward"]) == ("post", 1.5)


def test_conversion_and_step_counters():
    weights = parse("Transforming weights:  45%|████▌     | 131/291 [00:30<00:36,  4.39it/s]")
    assert (weights.kind, weights.done, weights.total) == ("count", 131, 291)
    step = parse("[tpu-rl] step 12/50")
    assert (step.text, step.done, step.total) == ("training steps", 12, 50)
    assert parse("some unrelated debug line") is None


def test_partial_and_interleaved_lines_are_joined_before_parsing():
    # A log read in chunks that split lines anywhere, with the runner's own lines interleaved.
    stream = (PRE + "\n[tpu-rl] step 1/50\n" + MID + "\nTransforming weights: 3/12\n").encode()
    chunks = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    lines = list(_lines(iter(chunks)))
    assert lines == [PRE, "[tpu-rl] step 1/50", MID, "Transforming weights: 3/12"]
    assert [parse(line).kind for line in lines] == ["eval", "count", "eval", "count"]


def test_a_line_without_newline_at_the_end_still_arrives():
    assert list(_lines(iter([b"Post RL", b" Training: x"]))) == ["Post RL Training: x"]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def watching(job: str, terminal: bool) -> tuple[JobProgress, io.StringIO, Clock]:
    out, clock = io.StringIO(), Clock()
    return JobProgress(Console(file=out, force_terminal=terminal, width=200), job, clock=clock), out, clock


def test_non_terminal_prints_heartbeats_with_eta():
    progress, out, clock = watching("train", terminal=False)
    with progress:
        progress.feed("[tpu-rl] step 1/50")
        clock.now = 31.0
        progress.feed("[tpu-rl] step 11/50")  # 10 steps in 31 s, 39 to go: 121 s
        clock.now = 40.0
        progress.tick()  # no new line yet: too soon for another heartbeat
        progress.feed(POST)
    text = out.getvalue()
    assert "[train] training steps 1/50" in text
    assert "[train] training steps 11/50, 0m31s elapsed, ETA 2m00s" in text
    assert text.count("elapsed") == 1
    assert "Post RL Training: corr=52" in text
    assert progress.evals[0]["accuracy"] == 65.0


def test_silent_job_still_shows_it_is_alive():
    progress, out, clock = watching("setup", terminal=False)
    with progress:
        progress.feed("==> install_tpu_post_train_extra_deps")
        for second in (30, 60, 90):
            clock.now = second
            progress.tick()
    assert out.getvalue().count("[setup] install_tpu_post_train_extra_deps, ") == 3
    assert "1m30s elapsed" in out.getvalue()


def test_terminal_shows_a_bar_not_heartbeats():
    progress, out, clock = watching("convert", terminal=True)
    with progress:
        progress.feed("Transforming weights: 6/12")
        clock.now = 100
        progress.feed("Transforming weights: 12/12")
        assert progress.bar is not None
        task = progress.bar.tasks[0]
        assert (task.completed, task.total, task.description) == (12, 12, "transforming weights")
    assert "elapsed" not in out.getvalue()


def test_eval_table():
    evals = [parse(line).eval for line in (PRE, MID, POST)]
    out = io.StringIO()
    Console(file=out, width=150).print(eval_table(evals))
    text = out.getvalue()
    assert "before training" in text and "step 10" in text and "after training" in text
    assert "65.00" in text and "52/80" in text


def test_shown_lines_drop_the_absl_prefix():
    assert parse(PRE).text.startswith("Pre RL Training: corr=31")
    assert (
        parse("W1130 12:00:00.000000 140 train_rl.py:9] RL Training Completed Successfully!").text
        == "RL Training Completed Successfully!"
    )
