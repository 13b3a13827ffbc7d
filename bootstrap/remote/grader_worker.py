"""The main module of MaxText's math_verify grader workers (maxtext_run.light_grader_workers): the grader's packages
as bare folders, so that a worker loads the grader's module alone.

A spawned worker loads its parent's main module, then the module of each function it is handed: here the grader's.
Its packages' __init__ load all of MaxText in 0.2.3 (JAX, Flax, every model: about 8 CPU-s) in every worker, at each
build of the pool and each replacement of a retired worker; the grader needs only math_verify and sympy. Stdlib only.
"""

from __future__ import annotations

import importlib.machinery
import multiprocessing.pool  # noqa: F401  0.2.5's grader names it in an annotation and never imports it
import os
import sys
import types

GRADER_POOL = "maxtext.trainers.post_train.rl.math_verify_pool"


def bare_packages(module: str = GRADER_POOL) -> None:
    """Each package above `module` that is not loaded yet, in sys.modules as its folders alone (no __init__ run)."""
    parts = module.split(".")[:-1]
    found = importlib.machinery.PathFinder.find_spec(parts[0])  # locates it on sys.path, loads nothing
    if found is None or not found.submodule_search_locations:
        return
    folders = list(found.submodule_search_locations)
    for depth, part in enumerate(parts):
        name = ".".join(parts[: depth + 1])
        folders = folders if depth == 0 else [os.path.join(folder, part) for folder in folders]
        if name in sys.modules:
            continue
        package = types.ModuleType(name)
        package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        package.__spec__.submodule_search_locations = package.__path__ = folders
        sys.modules[name] = package
        if depth:
            setattr(sys.modules[".".join(parts[:depth])], part, package)


if __name__ == "__mp_main__":  # a worker's main module (multiprocessing.spawn runs it under this name)
    bare_packages()
