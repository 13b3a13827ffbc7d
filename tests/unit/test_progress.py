"""Progress from the real log lines of MaxText 0.2.3's jobs (tests/fixtures/logs, recorded on CPU)."""

import io
from pathlib import Path

from rich.console import Console

from bootstrap.remote.evals import final as final_evals
from bootstrap.remote.evals import merged
from bootstrap.vm.output import Cleaner, lines
from bootstrap.vm.progress import Board, JobProgress, eval_table, parse

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
PRE = "W1130 21:04:06.730518 140248714398592 train_rl.py:716] Pre RL Training: corr=0, total=2, accuracy=0.0%, partial_accuracy=0.0%, format_accuracy=0.0%, mean_reward=0.0000"
RAW_FLOAT = "W1130 12:00:00.000000 1 train_rl.py:754] Post RL Training: corr=1, total=3, accuracy=33.33333333333333%, partial_accuracy=66.66666666666666%, format_accuracy=100.0%, mean_reward=-0.1250"


def recorded(job: str) -> list[str]:
    return list(lines([(LOGS / f"{job}.log").read_bytes()]))


def test_eval_lines_with_raw_float_accuracy():
    assert parse(RAW_FLOAT).eval == {
        "phase": "post",
        "step": None,
        "corr": 1,
        "total": 3,
        "accuracy": 33.33333333333333,
        "partial_accuracy": 66.66666666666666,
        "format_accuracy": 100.0,
        "mean_reward": -0.125,
    }


def test_the_recorded_train_log_gives_steps_and_every_eval():
    updates = [u for u in (parse(line, total_steps=4) for line in recorded("train")) if u]
    steps = [(u.done, u.total) for u in updates if u.kind == "count"]
    assert steps == [(1, 4), (2, 4), (3, 4), (4, 4)]
    evals = [(u.eval["phase"], u.eval["step"]) for u in updates if u.kind == "eval"]
    assert evals == [("pre", None), ("intermediate", 2), ("intermediate", 4), ("post", None)]
    notes = [u.text for u in updates if u.kind == "note"]
    assert "Starting RL training..." in notes and "RL Training Completed Successfully!" in notes


def test_the_final_step_is_not_counted_twice():
    evals = [u.eval for u in (parse(line) for line in recorded("train")) if u and u.kind == "eval"]
    assert [(e["phase"], e["step"]) for e in final_evals(evals, 4)] == [
        ("pre", None),
        ("intermediate", 2),
        ("post", None),
    ]


def test_the_recorded_convert_log_splits_tqdm_frames_on_carriage_returns():
    updates = [u for u in (parse(line) for line in recorded("convert")) if u]
    weights = [(u.done, u.total) for u in updates if u.text == "transforming weights"]
    assert weights[0] == (0, 12) and weights[-1] == (12, 12)
    notes = [u.text for u in updates if u.kind == "note"]
    assert any(n.startswith("Conversion complete. Checkpoint saved to") for n in notes)
    assert "Peak Memory: 0.51 GB" in notes  # the INFO:absl: prefix is dropped


def test_the_recorded_export_log_says_where_the_model_is():
    notes = [u.text for u in (parse(line) for line in recorded("export")) if u and u.kind == "note"]
    assert any("MaxText model successfully saved in HuggingFace format at" in n for n in notes)


def test_chunks_split_anywhere_and_carriage_returns_end_lines():
    stream = (PRE + "\r\nTransforming weights: 1/12\rTransforming weights: 3/12\n").encode()
    chunks = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    assert [line for line in lines(chunks) if line] == [
        PRE,
        "Transforming weights: 1/12",
        "Transforming weights: 3/12",
    ]
    assert list(lines([b"Post RL", b" Training: x"])) == ["Post RL Training: x"]


def test_shown_lines_have_the_token_redacted_and_control_sequences_removed():
    clean = Cleaner(["hf_secret123"])
    assert clean("token=hf_secret123 \x1b[31mred\x1b[0m\x1b]0;title\x07 bell\x07") == "token=<redacted> red bell"
    # control characters inside the token are stripped first, so they cannot hide it
    assert clean("a hf_sec\x1b[1mret123 b hf_secret\x00123 c") == "a <redacted> b <redacted> c"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def watching(job: str, terminal: bool, total: int | None = None):
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, force_terminal=terminal, width=200)
    board = Board(console)
    progress = JobProgress(console, job, total, board.bars, clock=clock)
    return board, progress, out, clock


def step(n: int) -> str:
    return f"I1130 21:04:16.454662 1 peft_trainer.py:488] Train step {n} training loss: 0.500000  - training perplexity: 1.000000"


def test_non_terminal_prints_steps_with_eta_and_heartbeats():
    board, progress, out, clock = watching("train", terminal=False, total=50)
    with board:
        progress.feed(step(1))
        clock.now = 31.0
        progress.feed(step(11))  # 10 steps in 31 s, 39 to go: 121 s
        clock.now = 40.0
        progress.tick()  # no new line yet: too soon for another heartbeat
        progress.feed(RAW_FLOAT)
    text = out.getvalue()
    assert "[train] training steps 1/50, 0m00s elapsed, loss 0.500000" in text
    assert "[train] training steps 11/50, 0m31s elapsed, ETA 2m00s, loss 0.500000" in text
    assert "Post RL Training: corr=1" in text
    assert progress.evals[0]["accuracy"] == 33.33333333333333


def test_silent_job_still_shows_it_is_alive():
    board, progress, out, clock = watching("setup", terminal=False)
    with board:
        progress.feed("==> install_tpu_post_train_extra_deps")
        for second in (30, 60, 90):
            clock.now = second
            progress.tick()
    assert out.getvalue().count("[setup] install_tpu_post_train_extra_deps, ") == 3
    assert "1m30s elapsed" in out.getvalue()


def test_terminal_shows_one_bar_per_job_on_one_display():
    board, convert, out, clock = watching("convert", terminal=True)
    setup = board.job("setup")
    with board:
        convert.feed("Transforming weights: 6/12")
        setup.feed("==> packages")
        clock.now = 100
        convert.feed("Transforming weights: 12/12")
        tasks = {t.fields["job"]: t for t in board.bars.tasks}
        assert (tasks["convert"].completed, tasks["convert"].total) == (12, 12)
        assert tasks["setup"].description == "packages"
    assert "elapsed" not in out.getvalue()


def test_eval_table():
    evals = [u.eval for u in (parse(line) for line in recorded("train")) if u and u.kind == "eval"]
    out = io.StringIO()
    Console(file=out, width=150).print(eval_table(final_evals(evals, 4)))
    text = out.getvalue()
    assert "before training" in text and "step 2" in text and "after training" in text
    assert "step 4" not in text and "0/2" in text


def test_a_resumed_attempts_pre_eval_is_not_the_base_models_and_the_first_attempts_is_kept():
    """On a new VM train_rl restores the last checkpoint (tunix's line), then its Pre eval scores those
    weights: shown as "resumed at step 2"; the base model's, from the lost VM's attempt, stays in the record."""
    first = JobProgress(Console(file=io.StringIO()), "train", total_steps=4)
    for line in recorded("train")[
        : next(i for i, line in enumerate(recorded("train")) if "Intermediate Eval" in line) + 1
    ]:
        first.feed(line)  # the lost VM's attempt, as this laptop saw it: the Pre eval and step 2's
    restored = "I1201 10:00:00.000000 1 checkpoint_manager.py:235] Restored params from step: 2 in 1.234 seconds"
    second = JobProgress(Console(file=io.StringIO()), "train", total_steps=4)
    for line in [restored, PRE.replace("corr=0", "corr=1").replace("accuracy=0.0%", "accuracy=50.0%", 1), RAW_FLOAT]:
        second.feed(line)
    assert [(e["phase"], e["step"]) for e in second.evals] == [("resumed", 2), ("post", None)]
    kept = merged(first.evals, second.evals)
    assert [(e["phase"], e["step"], e["accuracy"]) for e in kept] == [
        ("pre", None, 0.0),  # the base model, from the first attempt
        ("intermediate", 2, first.evals[1]["accuracy"]),
        ("resumed", 2, 50.0),
        ("post", None, 33.33333333333333),
    ]
    table = io.StringIO()
    Console(file=table, width=200).print(eval_table(kept))
    assert "before training" in table.getvalue() and "resumed at step 2" in table.getvalue()


def test_the_recorded_setup_log_gives_a_download_bar_in_mib_that_ends_full():
    """A first `fab demo` on a machine with nothing cached: uv's own lines, recorded (CPU environment, 388 MB)."""
    board, progress, out, clock = watching("setup", terminal=False)
    announced = []
    with board:
        for line in recorded("setup"):
            progress.feed(line)
            if progress.count and progress.phase.startswith("downloading"):
                announced.append(progress.count)
    sizes = [parse(line).size for line in recorded("setup") if line.startswith("Downloading ")]
    assert len(sizes) == 26 and announced[-1] == (round(sum(sizes)), round(sum(sizes)))
    assert all(done <= total for done, total in announced) and announced[0][0] == 0
    assert "[setup] downloading packages, MiB 0/" in out.getvalue() and "[setup] environment ready" in out.getvalue()
