"""Stand-in for maxtext.trainers.post_train.rl.train_rl: its log lines, events and checkpoint layout.

As the real trainer (tests/fixtures/logs/train.log): a `Train step N training loss:` line per
step; checkpoints at step 1, every checkpoint_period and the last, each with model_params/
and optimizer_state/, the oldest removed beyond max_num_checkpoints_to_keep (orbax's max_to_keep); one event file directly in tensorboard/, reward tags one step behind
the actor tags; an intermediate eval every eval_interval steps, the last step included (no eval at
all with num_test_batches=0);
accuracy printed as a raw float. Resumes like MaxText: a run with checkpoints continues
after its last step.
"""

import os

from maxtext import _standin

DEFAULTS = {"checkpoint_period": "50", "max_num_checkpoints_to_keep": "10"}  # rl.yml's


def eval_line(phase: str, step: int, restored: bool = False) -> str:
    """STANDIN_EVALS=BEFORE,AFTER,TOTAL: problems solved before training and at every eval after, out of TOTAL;
    else 3 of 9 before, one more every 4 steps. A resumed attempt's eval "before training" scores the restored,
    trained weights, as the real train_rl's does (AFTER)."""
    corr, total = min(9, 3 + step // 4), 9
    if given := os.environ.get("STANDIN_EVALS"):
        before, after, total = (int(n) for n in given.split(","))
        corr = before if phase.startswith("Pre") and not restored else after
    return (
        f"{phase}: corr={corr}, total={total}, accuracy={corr / total * 100}%, "
        f"partial_accuracy={min(100.0, corr / total * 100 + 2)}%, "
        f"format_accuracy={min(100.0, 60.0 + step)}%, mean_reward={step / 10:.4f}"
    )


def main() -> None:
    args = _standin.args()
    _standin.require_token()
    if not _standin.isdir(args["load_parameters_path"]):
        _standin.log(f"checkpoint not found: {args['load_parameters_path']}", "E", "train_rl.py:1")
        raise SystemExit(2)
    total = int(args.get("num_batches", "4"))
    period, keep = (int(args.get(key, value)) for key, value in DEFAULTS.items())
    eval_interval = int(args.get("eval_interval", "10"))
    evaluates = int(args.get("num_test_batches", "5")) > 0  # rl.yml's 5; 0: train_rl evaluates nothing
    run_dir = f"{args['base_output_directory'].rstrip('/')}/{args['run_name']}"
    actor = f"{run_dir}/checkpoints/actor"
    steps = _standin.committed_steps(actor)
    start = max(steps) + 1 if steps else 1
    if start > 1:
        # tunix 0.1.7's own line (tunix/sft/checkpoint_manager.py, maybe_restore), as train_rl logs it on resuming
        _standin.log(f"Restored params from step: {start - 1} in 0.012 seconds", where="checkpoint_manager.py:235")
    if evaluates:
        _standin.log(eval_line("Pre RL Training", 0, restored=start > 1), "W", "train_rl.py:716")
    _standin.log("Starting RL training...", "W", "train_rl.py:730")
    events = _standin.EventFile(f"{run_dir}/tensorboard/events.out.tfevents.{start}.standin")
    events.write(_standin.file_version_record())
    for step in range(start, total + 1):
        _standin.pause()
        if step == total // 2 + 1:
            _standin.maybe_fail("train_rl")
        events.write(_standin.event_record(step, {"actor/train/loss": 1.0 / step, "actor/train/kl": 0.01 * step}))
        events.write(_standin.event_record(step - 1, {"rewards/train/score/mean": step / total}))
        events.flush()
        _standin.log(
            f"Train step {step} training loss: {1.0 / step:.6f}  - training perplexity: 1.000000",
            where="peft_trainer.py:488",
        )
        if step == 1 or step % period == 0 or step == total:
            for item in ("model_params", "optimizer_state"):
                _standin.write(f"{actor}/{step}/{item}/manifest.ocdbt", f"step {step}\n".encode())
            if actor.startswith("gs://"):
                _standin.write(f"{actor}/{step}/commit_success.txt", b"committed\n")
            for old in _standin.committed_steps(actor)[:-keep]:
                _standin.rmtree(f"{actor}/{old}")
        if evaluates and eval_interval and step % eval_interval == 0:
            _standin.log(eval_line(f"Intermediate Eval (step={step})", step), "W", "hooks.py:98")
    _standin.log("RL Training Completed Successfully!", "W", "train_rl.py:741")
    if evaluates:
        _standin.log(eval_line("Post RL Training", total), "W", "train_rl.py:754")


if __name__ == "__main__":
    main()
