"""XPK itself (`xpk==1.16.0` from PyPI, without its dependencies): the reference the gke backend is compared with.

Only modules that work offline are used: its system characteristics (machine type,
hosts and chips per slice) and its Jinja templates (the Pathways JobSet, the queues).
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

VERSION = "1.16.0"
CACHE = Path.home() / ".cache" / "tpu-rl" / f"xpk-{VERSION}"


@cache
def install() -> Path:
    """XPK's package folder, installed once into the cache (seconds from PyPI)."""
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    with open(CACHE.with_name(f".{CACHE.name}.lock"), "a") as lock:  # one test worker installs it, the others wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (CACHE / "xpk" / "templates").is_dir():
            installing = CACHE.with_name(f"{CACHE.name}.part")
            shutil.rmtree(installing, ignore_errors=True)
            command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(installing),
                       f"xpk=={VERSION}"]  # fmt: skip
            subprocess.run(command, check=True)
            shutil.rmtree(CACHE, ignore_errors=True)
            installing.rename(CACHE)  # whole, or not there
    if str(CACHE) not in sys.path:
        sys.path.append(str(CACHE))
    return CACHE / "xpk"


def system(device_type: str):
    """XPK's SystemCharacteristics for e.g. `v6e-16`."""
    install()
    from xpk.core.system_characteristics import get_system_characteristics_by_device_type

    found, code = get_system_characteristics_by_device_type(device_type)
    assert code == 0, device_type
    return found
