#!/bin/bash
# The TPU VM's shutdown script (the instance's "shutdown-script" metadata; runs as root on every stop).
# On a preemption only, each tpu-rl pipeline on the VM records it where its run's durable state is and
# tells its receivers (bootstrap/remote/preempted.py), as the user who runs that pipeline, within the
# ~30 s Compute Engine gives a preempted VM. Any other stop (autostop, pulumi destroy): nothing.
# It holds no secret. The metadata server's URL and the homes can be set for the tests
# (tests/unit/test_preempted.py); the VM runs it with neither set.
set -u
METADATA=${TPU_RL_METADATA_URL:-http://metadata.google.internal/computeMetadata/v1}
HOMES=${TPU_RL_HOMES:-/home}

[ "$(curl -sf -m 2 -H 'Metadata-Flavor: Google' "$METADATA/instance/preempted")" = "TRUE" ] || exit 0
# Each registry is its user's own (written by that user's pipeline driver): its folders run as that user.
# A registry that is a link, or not owned by its home's owner, is skipped.
for registry in "$HOMES"/*/.config/tpu-rl/state-dirs; do
  [ -f "$registry" ] && [ ! -L "$registry" ] || continue
  owner=$(stat -c %U "$registry")
  [ "$owner" = "$(stat -c %U "${registry%/.config/tpu-rl/state-dirs}")" ] || continue
  while read -r state; do
    tool="$state/bin/preempted.py"
    [ -f "$tool" ] && timeout 20 runuser -u "$owner" -- python3 -E -s "$tool" "$state" &
  done < "$registry"
done
wait
