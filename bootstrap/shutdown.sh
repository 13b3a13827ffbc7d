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

say() { echo "tpu-rl shutdown: $*" >&2; }

# Whether PATH is its owner's to run: absolute, and every part from / down is a plain folder or file (no link) of
# root's or UID's that no one else may write; a folder of root's with the sticky bit (/tmp, /dev/shm) excepted on
# the way, where no one may rename or remove another's entry. A state folder in /dev/shm that another account made
# again after a restart fails here. Prints why not.
owned_by() {  # UID PATH
  local uid=$1 path=$2 current="" part owner mode
  case "$path" in
    /*) ;;
    *) echo "$path: not an absolute path"; return 1 ;;
  esac
  IFS=/ read -ra parts <<< "${path#/}"
  for part in "${parts[@]}"; do
    [ -n "$part" ] || continue
    if [ "$part" = . ] || [ "$part" = .. ]; then echo "$path: holds $part"; return 1; fi
    current="$current/$part"
    if [ -L "$current" ]; then echo "$current is a link"; return 1; fi
    read -r owner mode < <(stat -c '%u %a' "$current" 2>/dev/null) || { echo "$current: missing"; return 1; }
    if [ "$owner" != 0 ] && [ "$owner" != "$uid" ]; then echo "$current belongs to uid $owner"; return 1; fi
    if (( 8#$mode & 8#022 )) && ! { [ "$owner" = 0 ] && (( 8#$mode & 8#1000 )) && [ "$current" != "$path" ]; }; then
      echo "$current may be written by others (mode $mode)"; return 1
    fi
  done
}

[ "$(curl -sf -m 2 -H 'Metadata-Flavor: Google' "$METADATA/instance/preempted")" = "TRUE" ] || exit 0
# Each registry is its user's own (written by that user's pipeline driver): its folders run as that user, never
# as root. A registry that is a link, not its home's owner's, or that anyone else may write, is skipped, and so is
# a state folder whose tool is not its owner's alone (owned_by); each is said in the log.
for registry in "$HOMES"/*/.config/tpu-rl/state-dirs; do
  [ -e "$registry" ] || [ -L "$registry" ] || continue
  why=""
  uid=$(stat -c %u "${registry%/.config/tpu-rl/state-dirs}")
  if [ "$uid" = 0 ] || ! why=$(owned_by "$uid" "$registry") || [ "$(stat -c %u "$registry")" != "$uid" ]; then
    say "skipped $registry: ${why:-not owned by the owner of its home, or owned by root}"; continue
  fi
  owner=$(stat -c %U "$registry")
  while read -r state; do
    tool="$state/bin/preempted.py"
    if ! why=$(owned_by "$uid" "$tool"); then
      say "skipped $state: $why"; continue
    fi
    timeout 20 runuser -u "$owner" -- python3 -E -s "$tool" "$state" &
  done < "$registry"
done
wait
