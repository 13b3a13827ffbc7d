#!/bin/bash
# The TPU tier's wheelhouse, made on a machine with PyPI: every wheel of wheels.txt, for the TPU host's
# Python 3.11 on x86-64 Linux, into .whl-tpu/ at the repository's root (ignored by git; it travels to the TPU
# host beside the tree). maxtext declares Python >= 3.12, so its (pure) wheel is fetched as for 3.12;
# install.sh installs it with --ignore-requires-python (every module on the jobs' path runs on 3.11).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.whl-tpu
mkdir -p "$out"
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
grep -v '^#' tests/tpu/wheels.txt | while read -r wheel; do
  [ -n "$wheel" ] || continue
  python=3.11
  [ "${wheel%%==*}" = maxtext ] && python=3.12
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python" --implementation cp \
    "${platforms[@]}" -d "$out" "$wheel"
done
du -sh "$out"
