#!/usr/bin/env bash
# Stop the one-node test cluster started by scripts/slurm-up.sh: slurmd, slurmctld, munged.
# Safe to run when nothing runs. Installed packages and configuration are left in place.
#
#   --purge     also delete the state dir (controller state, spool, logs, jobcomp file)
#
# Environment: PEERWATCH_SLURM_STATE (default /var/lib/peerwatch-slurm);
# SLURM_DOWN_KEEP_MUNGE=1 / SLURM_DOWN_KEEP_DB=1 leave munged / mariadbd running (slurm-up.sh
# uses them to restart only the Slurm daemons after a configuration change).
set -euo pipefail

STATE="${PEERWATCH_SLURM_STATE:-/var/lib/peerwatch-slurm}"
PURGE=0
for arg in "$@"; do
    case "$arg" in
    --purge) PURGE=1 ;;
    *)
        echo "usage: $0 [--purge]" >&2
        exit 2
        ;;
    esac
done

log() { printf 'slurm-down: %s\n' "$*" >&2; }

# Stop the process named $1 (exact name) whose pid file is $2: SIGTERM, wait up to 15 s,
# then SIGKILL. Falls back to the exact process name when the pid file is missing or stale.
stop_daemon() {
    local name="$1" pid_file="$2" pids=() pid
    if [[ -f "$pid_file" ]]; then
        pid="$(cat "$pid_file")"
        if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
            pids+=("$pid")
        fi
    fi
    if ((${#pids[@]} == 0)); then
        mapfile -t pids < <(pgrep -x "$name" || true)
    fi
    if ((${#pids[@]} == 0)); then
        rm -f "$pid_file"
        return 0
    fi
    log "stopping $name (pid ${pids[*]})"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    local deadline=$((SECONDS + 15))
    for pid in "${pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null; do
            if ((SECONDS >= deadline)); then
                log "$name (pid $pid) ignored SIGTERM: killing it"
                kill -KILL "$pid" 2>/dev/null || true
                break
            fi
            sleep 0.1
        done
    done
    rm -f "$pid_file"
}

stop_daemon slurmd "$STATE/run/slurmd.pid"
# Job steps outlive slurmd; without it nothing would ever reap them.
stop_daemon slurmstepd /nonexistent/slurmstepd.pid
stop_daemon slurmctld "$STATE/run/slurmctld.pid"
stop_daemon slurmdbd "$STATE/run/slurmdbd.pid"
if [[ "${SLURM_DOWN_KEEP_DB:-0}" != 1 ]]; then
    stop_daemon mariadbd /run/mysqld/mariadbd.pid
fi
if [[ "${SLURM_DOWN_KEEP_MUNGE:-0}" != 1 ]]; then
    stop_daemon munged /run/munge/munged.pid
fi

if ((PURGE)); then
    # Refuse to remove anything that does not look like our state dir.
    if [[ -d "$STATE/ctld" && -d "$STATE/spool" ]]; then
        log "removing $STATE"
        rm -rf -- "$STATE"
    elif [[ -e "$STATE" ]]; then
        log "not purging $STATE: it does not look like a slurm-up.sh state dir"
        exit 1
    fi
fi
log "stopped"
