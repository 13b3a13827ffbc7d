"""What `fab demo` downloads and how long it takes, the first time (nothing cached) and again.

    .venv/bin/python benchmarks/bench_demo.py [--download-only]

The download: the CPU environment's wheels as uv picks them for CPython 3.12 on Linux x86_64, their sizes read
from PyPI's simple API (what a fresh machine fetches; uv's own cache holds them unpacked, larger). The time: `fab
demo` in a new demo folder with an empty uv cache (the first time, the environment's download and install
included), then `fab demo` again in the same folder (its environment kept). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bootstrap.demo import cpu, rehearsal  # noqa: E402
from bootstrap.paths import REPO  # noqa: E402
from scripts.maxtext_config_env import python312  # noqa: E402

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"  # PyPI's simple API, with each file's size (PEP 691, 700)
WHEEL_TAGS = (
    r"cp312-cp312-manylinux[^-]*x86_64",
    r"cp3\d+-abi3-manylinux[^-]*x86_64",
    r"py3-none-manylinux[^-]*x86_64",
    r"(py3|py2.py3)-none-any",
)


def download_bytes() -> tuple[int, int]:
    """The environment's wheels' sizes on PyPI, summed; and how many packages."""
    pins = [*cpu.environment(Path("venv"))["packages"], f"google-tunix=={cpu.TUNIX}"]
    total = 0
    for pin in pins:
        name, version = pin.split("==")
        asked = urllib.request.Request(f"https://pypi.org/simple/{name}/", headers={"Accept": SIMPLE_JSON})
        with urllib.request.urlopen(asked, timeout=60) as answer:
            files = [f for f in json.load(answer)["files"] if f"-{version}" in f["filename"]]
        wheels = [f for tag in WHEEL_TAGS for f in files if re.search(rf"-{tag}\.whl$", f["filename"])]
        sdists = [f for f in files if f["filename"].endswith((".tar.gz", ".zip"))]
        if not wheels + sdists:
            raise SystemExit(f"{pin}: no file for CPython 3.12 on Linux x86_64 among {[f['filename'] for f in files]}")
        total += (wheels + sdists)[0]["size"]
    return total, len(pins)


def demo(folder: Path, uv_cache: Path) -> float:
    """One `fab demo` in `folder`, its seconds."""
    env = {
        **os.environ,
        rehearsal.ROOT_ENV: str(folder),
        "UV_CACHE_DIR": str(uv_cache),
        "PATH": f"{Path(python312()).parent}:{os.environ['PATH']}",
    }
    started = time.monotonic()
    done = subprocess.run(
        [Path(sys.executable).with_name("fab"), "-r", REPO, "demo"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--download-only", action="store_true", help="only the download's size")
    options = parser.parse_args()
    size, packages = download_bytes()
    found = {"packages": packages, "download_mb": round(size / 1e6)}
    if not options.download_only:
        with tempfile.TemporaryDirectory() as tmp:
            folder, uv_cache = Path(tmp) / "demo", Path(tmp) / "uv-cache"
            found["first_s"] = round(demo(folder, uv_cache), 1)
            found["again_s"] = round(demo(folder, uv_cache), 1)
            found["folder_mb"] = round(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6)
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
