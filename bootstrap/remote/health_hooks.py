"""health.py's rules, hooked into the trainer's own code (tunix and MaxText, in train's process only).

- tunix's MetricsLogger.log: every scalar train logs passes through health.Watch.
- MaxText's evaluate_rl.generate_responses, and the sampler's generate under it: the answers of the eval before
  training, with whether each ended before the length limit, for health.smoke.
- the sampler asked for its log-probabilities, and tunix's GRPO learner, after it made a step's batch: the trainer's
  log-probabilities of the same tokens (one forward pass), and their agreement, logged as a train metric.

Each hook wraps the library's own function and calls it unchanged; nothing in site-packages is edited.
"""

from __future__ import annotations

import dataclasses
import functools

try:
    from . import health  # on the laptop: bootstrap.remote
except ImportError:
    import health  # on the VM: beside this script in the tools folder


class Hooks:
    """What the hooks saw: the smoke's answers and the watch."""

    def __init__(self, rules: health.Rules):
        self.rules, self.watch = rules, health.Watch(rules, health.say)
        self.answers: list[str] = []
        self.ended: list[bool] = []
        self.evaluating = False

    def evaluated(self, found: dict) -> None:
        """An eval's result (eval_recorder.EvalRecorder): the one before training is the smoke rollout's verdict. Right
        answers: a task's right count (none for a mean reward), else GSM8K's. A resumed start checked its base model
        at the run's first start: its eval is of the restored weights, not the model before training."""
        if not self.rules.smoke or found["phase"] != "pre" or self.watch.trained:
            return
        if not self.answers:
            health.say("[tpu-rl] health: no answer of the eval before training reached the sampler's hook: not checked")
            return
        task = found.get("task")
        right = (task or {}).get("right") if task else found.get("corr")
        if (
            stop := health.smoke(self.answers, self.ended, None if right is None else int(right), self.rules)
        ) is not None:
            raise stop
        health.say(f"[tpu-rl] health: the smoke rollout passed: {len(self.answers)} answers before training")
        self.answers, self.ended = [], []

    def generated(self, rollout_config, out) -> None:
        """A sampler's output: kept while the eval before training runs (the smoke rollout's answers)."""
        if self.evaluating and not self.watch.trained:
            self.answers += list(out.text)
            self.ended += [len(tokens) < rollout_config.max_tokens_to_generate for tokens in out.tokens]


def install(rules: health.Rules) -> Hooks:
    """Each hook into the trainer's code; where the environment has no tunix or MaxText (a stand-in), none: said."""
    hooks = Hooks(rules)
    try:
        _watch_metrics(hooks)
        _watch_sampler(hooks)
        if rules.agreement:
            _agreement()
    except ImportError as err:
        health.say(f"[tpu-rl] health: no rules watch this train ({err.name} is not importable here)")
    return hooks


def _watch_metrics(hooks: Hooks) -> None:
    from tunix.sft import metrics_logger

    logged = metrics_logger.MetricsLogger.log

    @functools.wraps(logged)
    def log(self, metrics_prefix, metric_name, scalar_value, mode, step):
        logged(self, metrics_prefix, metric_name, scalar_value, mode, step)
        hooks.watch.scalar(metrics_prefix, metric_name, scalar_value, mode, step)

    metrics_logger.MetricsLogger.log = log


def _watch_sampler(hooks: Hooks) -> None:
    """The sampler of every RLCluster: its eval answers kept, and (for the agreement) its log-probabilities."""
    from maxtext.trainers.post_train.rl import evaluate_rl
    from tunix.rl import rl_cluster

    generate_responses = evaluate_rl.generate_responses

    @functools.wraps(generate_responses)
    def responses(*args, **kwargs):
        hooks.evaluating = True
        try:
            return generate_responses(*args, **kwargs)
        finally:
            hooks.evaluating = False

    evaluate_rl.generate_responses = responses
    made = rl_cluster.RLCluster.__init__

    @functools.wraps(made)
    def init(self, *args, cluster_config, **kwargs):
        if hooks.rules.agreement:  # asked as the sampler is built: vLLM's is fixed then (MaxText 0.2.5 passes it on)
            cluster_config = dataclasses.replace(cluster_config, rollout_config=_with_logprobs(cluster_config))
        made(self, *args, cluster_config=cluster_config, **kwargs)
        generate = self.rollout.generate

        def watched(prompts, rollout_config, *more, **options):
            out = generate(prompts, rollout_config, *more, **options)
            self._tpu_rl_logprobs = out.logprobs
            hooks.generated(rollout_config, out)
            return out

        self.rollout.generate = watched

    rl_cluster.RLCluster.__init__ = init


def _with_logprobs(cluster_config):
    """The cluster's rollout configs (one, or one a mode), each asking the sampler for its log-probabilities of the
    tokens it chose, before any temperature or top-p (vLLM's raw_logprobs): the model's own, as the trainer's are."""

    def asked(config):
        config = dataclasses.replace(config, return_logprobs=True)
        if hasattr(config, "rollout_vllm_logprobs_mode"):
            config = dataclasses.replace(config, rollout_vllm_logprobs_mode="raw_logprobs")
        return config

    found = cluster_config.rollout_config
    return {mode: asked(config) for mode, config in found.items()} if isinstance(found, dict) else asked(found)


def _agreement() -> None:
    """After the GRPO learner made a step's batch: the trainer's log-probabilities of the sampled tokens (one forward
    pass of the trainer's model), against the sampler's, as a train metric."""
    import numpy as np
    from flax import nnx
    from tunix.rl import common, rl_cluster
    from tunix.rl.grpo import grpo_learner

    advantage = grpo_learner.GRPOLearner._generate_and_compute_advantage

    @functools.wraps(advantage)
    def measured(self, training_input, mode=rl_cluster.Mode.TRAIN):
        example = advantage(self, training_input, mode)
        cluster = self.rl_cluster
        sampled = getattr(cluster, "_tpu_rl_logprobs", None)
        if mode != rl_cluster.Mode.TRAIN or not sampled:
            return example
        with cluster._get_mesh_and_logical_axis_rules_cm(rl_cluster.Role.ACTOR):
            graphdef, state = nnx.split(cluster.actor_trainer.model)
            trainer = np.asarray(
                common.compute_per_token_logps(
                    graphdef, state, prompt_tokens=example.prompt_ids, completion_tokens=example.completion_ids,
                    pad_id=cluster.rollout.pad_id(), eos_id=cluster.rollout.eos_id(), stop_gradient=True,
                )
            )  # fmt: skip
        lengths = np.asarray(example.completion_mask, dtype=bool).sum(axis=1)
        errors = [
            np.exp(np.abs(np.asarray(lp)[:n] - trainer[row, :n]))
            for row, (lp, n) in enumerate(zip(sampled, lengths, strict=False))
        ]
        value = float(np.mean(np.concatenate(errors))) if errors else float("nan")
        cluster.buffer_metrics({f"sampler_trainer/{health.AGREEMENT}": (value, np.mean)}, mode=mode)
        return example

    grpo_learner.GRPOLearner._generate_and_compute_advantage = measured
