#!/usr/bin/env bash
# Instructions of one part of an archive replay (see scripts/bench_instructions.py), printed alone.
# Usage: bash scripts/bench_instructions.sh decoder|replay ARCHIVE --from MS --to MS
# Compare two commits: run each checkout's own copy of this script from a folder outside both,
# the older with PYTHONPATH=<its checkout> and a .venv there linked to this one's (ln -s): the
# script imports what its own commit has.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
PYTHONHASHSEED=0 UNDER_CALLGRIND=1 valgrind --tool=callgrind --instr-atstart=no \
    --collect-atstart=no --toggle-collect=sys_call_tracing \
    --callgrind-out-file="$out/callgrind.out" \
    "$here/.venv/bin/python" "$here/scripts/bench_instructions.py" "$@" 2>"$out/log" \
    || { tail -20 "$out/log" >&2; exit 1; }
grep -o 'Collected : [0-9]*' "$out/log" | awk '{print $3 " instructions"}'
