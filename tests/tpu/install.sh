#!/bin/bash
# The TPU tier's environment, on a TPU host without network: a venv at $1 from the carried wheels (.whl-tpu,
# made by wheelhouse.sh) and the host's own package index, pinned (index.txt), in the layout fab's setup job
# leaves: then the tier's jobs run in it as they run in the VM's. Prints how long each part took.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=$1
index=${TPU_RL_TPU_INDEX:-file:///opt/pypi/simple}
started=$(date +%s.%N)
python3 -m venv "$venv"
pip() { PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip --isolated -q --disable-pip-version-check "$@"; }
pip install --no-deps --no-index --ignore-requires-python .whl-tpu/*.whl
carried=$(date +%s.%N)
grep -v '^#' tests/tpu/index.txt > "$venv/index-requirements.txt"
pip install --index-url "$index" --find-links .whl-tpu -r "$venv/index-requirements.txt"
done_at=$(date +%s.%N)
python3 - "$started" "$carried" "$done_at" "$venv" <<'PY'
import json, sys
started, carried, done, venv = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
timing = {"carried_wheels_s": round(carried - started, 1), "index_s": round(done - carried, 1), "total_s": round(done - started, 1)}
print(f"[tpu tier] installed {venv}: {json.dumps(timing)}")
open(f"{venv}/install-timing.json", "w").write(json.dumps(timing))
PY
