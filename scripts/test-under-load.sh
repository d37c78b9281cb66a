#!/usr/bin/env bash
# Run pytest while a CPU hog keeps every core busy: N busy-loop processes (default: nproc) at
# normal priority, started before pytest and stopped after it, whatever happens. The suite must
# pass like this (tests assert outcomes, never wall-clock durations: speed is for benchmarks).
#
#   scripts/test-under-load.sh [pytest args...]        (default: tests/unit)
#   PEERWATCH_HOGS=4 scripts/test-under-load.sh tests/unit -x -q
#
# Prints the hogs, pytest's own summary line, and a last line "under load: <N> hogs, pytest exit
# <rc>, <seconds> s"; exits with pytest's status.
set -uo pipefail
cd "$(dirname "$0")/.."

python=${PEERWATCH_PYTHON:-.venv/bin/python}
[[ -x $python ]] || python=$(command -v python3)
hogs=${PEERWATCH_HOGS:-$(nproc)}
if ! [[ $hogs =~ ^[0-9]+$ ]] || ((hogs < 1)); then
    echo "PEERWATCH_HOGS must be a positive integer, got '$hogs'" >&2
    exit 2
fi

pids=()
stop_hogs() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids=()
}
trap stop_hogs EXIT INT TERM

for ((i = 0; i < hogs; i++)); do
    # A pure busy loop in the shell itself: no I/O, normal (inherited) priority.
    (while :; do :; done) &
    pids+=("$!")
done
echo "under load: started $hogs busy-loop processes (pids ${pids[*]}) on $(nproc) cores"

start=$(date +%s)
"$python" -m pytest "${@:-tests/unit}"
rc=$?
elapsed=$(($(date +%s) - start))

alive=0
for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=$((alive + 1)); done
stop_hogs
echo "under load: $hogs hogs ($alive still spinning at the end), pytest exit $rc, ${elapsed} s"
exit "$rc"
