"""The trainer's evals, recorded as it logs them: one record an eval, in the folder attempts.EVALS_ENV names.

Apart from attempts.py because it hooks Python's logging, which only train's launcher (maxtext_run.py) needs:
attempts.py is read by every fab command's driver on the VM, and importing logging there cost each one about
8 ms. Standard library only: it runs on the VM and in a gke pod, with the job's own python.
"""

from __future__ import annotations

import logging
import sys
import time

try:
    from . import attempts, evals  # on the laptop: bootstrap.remote
except ImportError:
    import attempts  # on the VM and in a pod: beside this script in the tools folder
    import evals

TASK_TALLY = "tpu_rl_task_tally"  # in sys.modules: a task's eval scores, kept by task_rewards.py


class EvalRecorder(logging.Handler):
    """Records each GSM8K eval the trainer logs (MaxText and tunix log through absl, that is Python's logging),
    labelled as evals.Attempts labels a log's lines: after tunix's restore line, the "Pre RL Training" eval scores
    the restored weights and is kept as "resumed", so the base model's eval before training is never replaced.
    A record that cannot be written is said on stderr and never stops the job; the gate then says it is missing."""

    def __init__(self, folder: str):
        super().__init__()
        self.folder, self.attempts = folder, evals.Attempts()
        self.listeners: list = []  # told each eval as recorded (health's smoke rollout: the one before training)

    @classmethod
    def install(cls, environ: dict[str, str]) -> EvalRecorder | None:
        """On the root logger, for the job whose environment names a folder; None for one that names none."""
        folder = environ.get(attempts.EVALS_ENV, "").rstrip("/")
        if not folder:
            return None
        recorder = cls(folder)
        logging.getLogger().addHandler(recorder)
        return recorder

    def emit(self, entry: logging.LogRecord) -> None:
        try:
            self.read(entry.getMessage())
        except Exception as err:  # noqa: BLE001 - a storage error of any kind must not stop the training
            print(f"[tpu-rl] could not record an eval in {self.folder}: {err}", file=sys.stderr)

    def read(self, line: str) -> str | None:
        """Record the eval on this line of the trainer's output, if it holds one, with the task's measure of it
        (said in the log too: the laptop reads it there); where."""
        found = self.attempts.read(line)
        if found is None or "total" not in found:
            return None
        tally = sys.modules.get(TASK_TALLY)  # a task of your own's eval scores (task_rewards.py), else none
        if tally is not None and (measured := tally.take()) is not None:
            found["task"] = {"name": tally.task, **measured}
            print(evals.task_line(found["phase"], found["step"], measured, tally.task), file=sys.stderr, flush=True)
        where = attempts.record(self.folder, {**found, "recorded": time.time()})
        for listener in self.listeners:
            listener(found)
        return where
