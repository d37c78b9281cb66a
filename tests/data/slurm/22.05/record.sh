#!/usr/bin/env bash
# Re-record the Slurm 22.05 outputs in this directory from a fresh one-node test cluster.
# Run as root from the repository root: tests/data/slurm/22.05/record.sh
# It purges and restarts the cluster of scripts/slurm-up.sh (job ids restart at 1).
set -euo pipefail
OUT="$(cd "$(dirname "$0")" && pwd)"
NODE="$(hostname -s)"

wait_for() { # wait_for <timeout_s> <command...>: poll until the command succeeds
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || { echo "timed out waiting for: $*" >&2; exit 1; }
        sleep 0.2
    done
}
job_state() { squeue -h -t all -j "$1" -o '%T' | head -n 1; }
job_is() { [[ "$(job_state "$1")" == "$2" ]]; }
node_is() { [[ "$(sinfo -h -N -n "$NODE" -o '%T')" == "$1" ]]; }
json() { "$@" --json | python3 -m json.tool --indent 2; }

scripts/slurm-down.sh --purge
scripts/slurm-up.sh

json sinfo >"$OUT/sinfo-idle.json"
scontrol show node -o >"$OUT/scontrol-node-idle.txt"

# One 3-GPU job on one of the two CPUs: the node is "mixed".
big=$(sbatch --parsable -J train-big --gres=gpu:3 --wrap 'sleep 300')
wait_for 30 job_is "$big" RUNNING
json sinfo >"$OUT/sinfo-mixed.json"
scontrol show node -o >"$OUT/scontrol-node-mixed.txt"
json squeue >"$OUT/squeue-one-running.json"

# Running: the 3-GPU job, two tasks of a 1-GPU array, a 2-GPU job (7 of 8 GPUs).
# Pending: a 4-GPU job (Resources) and the array's third task (Priority).
arr=$(sbatch --parsable -J sweep --array=0-2%2 --gres=gpu:1 --wrap 'sleep 300')
two=$(sbatch --parsable -J eval --gres=gpu:2 --wrap 'sleep 300')
pend=$(sbatch --parsable -J train-wide --gres=gpu:4 --wrap 'sleep 5')
wait_for 30 job_is "$big" RUNNING
wait_for 30 job_is "$two" RUNNING
wait_for 30 job_is "${arr}_1" RUNNING
json squeue >"$OUT/squeue-running-pending.json"
json sinfo >"$OUT/sinfo-allocated.json"
scontrol show node -o >"$OUT/scontrol-node-allocated.txt"

# Drain while jobs run (draining), then with none (drained).
scontrol update nodename="$NODE" state=drain reason="peerwatch: sm clock 12% below peers"
json sinfo >"$OUT/sinfo-draining.json"
scancel "$big" "$two" "$pend" "$arr"
wait_for 60 node_is drained
json sinfo >"$OUT/sinfo-drained.json"
sinfo -R >"$OUT/sinfo-R-drained.txt"
scontrol show node -o >"$OUT/scontrol-node-drained.txt"
scontrol update nodename="$NODE" state=resume
wait_for 30 node_is idle

# Finished jobs: completed, failed with exit code 3, cancelled while running.
ok=$(sbatch --parsable -J ok --gres=gpu:1 --wrap 'sleep 1')
bad=$(sbatch --parsable -J bad --gres=gpu:2 --wrap 'exit 3')
cx=$(sbatch --parsable -J cancelled --gres=gpu:1 --wrap 'sleep 300')
wait_for 30 job_is "$cx" RUNNING
scancel "$cx"
wait_for 30 job_is "$ok" COMPLETED
wait_for 30 job_is "$bad" FAILED
wait_for 30 job_is "$cx" CANCELLED
# slurmdbd receives job completions asynchronously.
finished() {
    local listed
    listed="$(sacct -a -n -X -P -o jobid,state)"
    for j in "$ok" "$bad" "$cx"; do grep -q "^$j|" <<<"$listed" || return 1; done
    ! grep -qE 'RUNNING|PENDING' <<<"$listed"
}
wait_for 30 finished
json squeue -t all >"$OUT/squeue-finished.json"
json sacct -a >"$OUT/sacct.json"
sacct -a -o jobid,jobname,state,exitcode,alloctres%60 >"$OUT/sacct.txt"
sinfo --version >"$OUT/VERSION"
echo "recorded into $OUT"
