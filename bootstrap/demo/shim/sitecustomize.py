"""The CPU stand-in for what a TPU VM has (fab demo and the CPU tier put it on PYTHONPATH). Nothing in
site-packages is edited; each part is a patch applied when its module is imported.

- MAXTEXT_CPU_ROLLOUT=1: MaxText's train_rl imports its vLLM rollout at module level (vLLM needs
  a TPU); that one import loads cpu_rollout.py instead. From 0.2.4 train_rl also imports and
  registers its vLLM model adapter at module level (it needs tpu_inference): that import gets
  an empty `register()` instead, since nothing here runs vLLM. The trainer, model, data,
  rewards, eval, checkpointing and TensorBoard stay the real code.
- TensorFlow's gfile for `gs://` folders. The VM's environment has TensorFlow, so epath makes a
  gs:// folder with tf.io.gfile, which writes a `folder/` placeholder object; this one has no
  TensorFlow, and gcsfs makes nothing, so MaxText's check that the folder now exists
  (`gcs_utils.mkdir_and_check_permissions`) would fail. The placeholder is written here instead.
- Each build of MaxText's math_verify grader pool is said in the job's log (GRADER_BUILT): a test counts
  them, since 0.2.3 builds the pool again, with fresh workers, whenever the size it asks for changes.
- Each batch GRPO generates for is said in the job's log (BATCH: the mode, then a short hash of each prompt's
  text), so that a test can tell which problems each step trained on, by content, across a resume.
- TPU_RL_CPU_HOLD_FILE=PATH: a VM lost right after a checkpoint. While PATH exists and holds a
  step number, train holds once that step's checkpoint is committed (PATH.held says so) until it
  is killed, so that a test loses the VM exactly there.
"""

import hashlib
import importlib.abc
import importlib.util
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROLLOUT_MODULE = "maxtext.integration.vllm.maxtext_vllm_rollout"
GRADER_MODULE = "maxtext.trainers.post_train.rl.math_verify_pool"
GRADER_BUILT = "[shim] math_verify grader pool built with"
ADAPTER_MODULE = "maxtext.integration.vllm.maxtext_vllm_adapter"  # train_rl 0.2.4+: `adapter.register()`
LEARNER_MODULE = "tunix.rl.grpo.grpo_learner"
BATCH = "[shim] GRPO batch"


class _Replace(importlib.abc.MetaPathFinder):
    """Loads `path` when `name` is imported."""

    def __init__(self, name, path):
        self.name, self.path = name, path

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_file_location(fullname, self.path) if fullname == self.name else None


class _Unregistered(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`name` as a module whose `register()` does nothing."""

    def __init__(self, name):
        self.name = name

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname == self.name else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.register = lambda config=None: None


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `patch(module)` once `name` has been imported."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # the module's own spec, found without this finder
        spec = importlib.util.find_spec(fullname)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _gfile_folders(backend):
    """mkdir and makedirs of a gs:// folder also write its `folder/` placeholder, as tf.io.gfile does."""
    fsspec_backend = backend._FileSystemSpecBackend

    def placing(make):
        def made(self, path, **kwargs):
            make(self, path, **kwargs)
            path = os.fspath(path)
            if path.startswith("gs://"):
                from google.cloud import storage

                bucket, _, folder = path[len("gs://") :].partition("/")
                placeholder = storage.Client().bucket(bucket).blob(folder.rstrip("/") + "/")
                if folder and not placeholder.exists():
                    placeholder.upload_from_string(b"")

        return made

    fsspec_backend.mkdir = placing(fsspec_backend.mkdir)
    fsspec_backend.makedirs = placing(fsspec_backend.makedirs)


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def _hold_after_checkpoint(checkpoint_manager):
    """tunix's CheckpointManager.save, held after the step TPU_RL_CPU_HOLD_FILE names."""
    hold = os.environ["TPU_RL_CPU_HOLD_FILE"]
    save = checkpoint_manager.CheckpointManager.save

    def saving(self, step, *args, **kwargs):
        saved = save(self, step, *args, **kwargs)
        if _read(hold) == str(step):
            self._checkpoint_manager.wait_until_finished()
            with open(hold + ".held", "w") as held:
                held.write(f"{step}\n")
            threading.Event().wait()
        return saved

    checkpoint_manager.CheckpointManager.save = saving


def _count_grader_pools(grader):
    """Says each time MaxText's grader pool is built (none, or a live one of another size, is replaced)."""
    build = getattr(grader, "_get_pool", None)
    if build is None:
        return

    def counted(num_procs):
        if grader._POOL is None or num_procs != grader._POOL_NUM_PROCS:
            print(f"{GRADER_BUILT} {num_procs} worker(s)", file=sys.stderr, flush=True)
        return build(num_procs)

    grader._get_pool = counted


def _say_batches(learner):
    """Says each batch's prompts (by a hash of their text) as GRPO generates for it, with the mode."""
    generate = learner.GRPOLearner._generate_and_compute_advantage

    def saying(self, training_input, *args, **kwargs):
        mode = kwargs.get("mode", args[0] if args else "TRAIN")
        hashes = ",".join(hashlib.sha256(str(p).encode()).hexdigest()[:8] for p in training_input["prompts"])
        print(f"{BATCH} {getattr(mode, 'name', mode)} {hashes}", file=sys.stderr, flush=True)
        return generate(self, training_input, *args, **kwargs)

    learner.GRPOLearner._generate_and_compute_advantage = saying


sys.meta_path.insert(0, _AfterImport(LEARNER_MODULE, _say_batches))
sys.meta_path.insert(0, _AfterImport("etils.epath.backend", _gfile_folders))
sys.meta_path.insert(0, _AfterImport(GRADER_MODULE, _count_grader_pools))
if os.environ.get("MAXTEXT_CPU_ROLLOUT") == "1":
    sys.meta_path.insert(0, _Replace(ROLLOUT_MODULE, os.path.join(HERE, "cpu_rollout.py")))
    sys.meta_path.insert(0, _Unregistered(ADAPTER_MODULE))
if os.environ.get("TPU_RL_CPU_HOLD_FILE"):
    sys.meta_path.insert(0, _AfterImport("tunix.sft.checkpoint_manager", _hold_after_checkpoint))
