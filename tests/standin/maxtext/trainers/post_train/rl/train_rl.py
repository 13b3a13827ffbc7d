"""Stand-in for maxtext.trainers.post_train.rl.train_rl: eval lines, events, checkpoints.

Resumes like MaxText: a run name with checkpoints continues after its last step.
"""

import os

from maxtext import _standin

CHECKPOINT_EVERY = 2
EVAL_EVERY = 10


def eval_line(phase: str, step: int) -> str:
    corr = 30 + step
    return (
        f"{phase}: corr={corr}, total=80, accuracy={corr / 80 * 100:.2f}%, partial_accuracy={corr / 80 * 100 + 2:.2f}%, "
        f"format_accuracy={min(100, 60 + step):.2f}%, mean_reward={step / 10:.4f}"
    )


def main() -> None:
    args = _standin.args()
    _standin.require_token()
    if not os.path.isdir(args["load_parameters_path"]):
        _standin.log(f"checkpoint not found: {args['load_parameters_path']}")
        raise SystemExit(2)
    total = int(args.get("num_batches", "4"))
    run_dir = os.path.join(args["base_output_directory"], args["run_name"])
    actor = os.path.join(run_dir, "checkpoints", "actor")
    os.makedirs(actor, exist_ok=True)
    steps = [int(s) for s in os.listdir(actor) if s.isdigit()]
    start = max(steps) + 1 if steps else 1
    if start > 1:
        _standin.log(f"Restoring checkpoint from step {start - 1}")
    _standin.log(eval_line("Pre RL Training", 0))
    _standin.log("Starting RL training...")
    tensorboard = os.path.join(run_dir, "tensorboard")
    os.makedirs(tensorboard, exist_ok=True)
    path = os.path.join(tensorboard, f"events.out.tfevents.{start}.standin")
    with open(path, "ab") as events:
        events.write(_standin.file_version_record())
        for step in range(start, total + 1):
            _standin.pause()
            if step == total // 2 + 1:
                _standin.maybe_fail("train_rl")
            scalars = {
                "rewards/train/score/mean": step / total,
                "actor/train/loss": 1.0 / step,
                "actor/train/kl": 0.01 * step,
            }
            events.write(_standin.event_record(step, scalars))
            events.flush()
            if step % CHECKPOINT_EVERY == 0 or step == total:
                os.makedirs(os.path.join(actor, str(step), "model_params"), exist_ok=True)
                with open(os.path.join(actor, str(step), "model_params", "params.ocdbt"), "w") as f:
                    f.write(f"step {step}\n")
            if step % EVAL_EVERY == 0:
                _standin.log(eval_line(f"Intermediate Eval (step={step})", step))
    _standin.log("RL Training Completed Successfully!")
    _standin.log(eval_line("Post RL Training", total))


if __name__ == "__main__":
    main()
