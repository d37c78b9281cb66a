#!/usr/bin/env bash
# Differential fuzzing of the C Avro decoder under AddressSanitizer and UBSan: builds the C
# modules below with sanitizers into a temporary folder, then runs scripts/fuzz_native.py (the
# C decoder against the generated Python reader on mutated records of every schema) for
# FUZZ_SECONDS. Fails on any mismatch and on any sanitizer report.
#
#   bash scripts/fuzz_native.sh            # or: make fuzz
#   FUZZ_SECONDS=600 FUZZ_SEED=42 bash scripts/fuzz_native.sh
#
# Needs gcc (with its libasan/libubsan: Debian's gcc package has both) and the Python headers;
# scripts/setup.sh installs both. PYTHON defaults to .venv/bin/python.
set -euo pipefail
cd "$(dirname "$0")/.."

# The C modules to build with sanitizers: "module name=source". The driver's TARGETS say which
# entry points of them are compared with which Python reader.
NATIVE_MODULES=(
    "_avro_native=schemas/_avro_native.c"
)
FUZZ_SECONDS="${FUZZ_SECONDS:-120}"
PYTHON="${PYTHON:-.venv/bin/python}"
CC="${CC:-gcc}"

log() { printf 'fuzz: %s\n' "$*" >&2; }

command -v "$CC" >/dev/null || { log "no $CC: install gcc (scripts/setup.sh does)"; exit 2; }
# gcc prints the bare name back when it has no such library. On Debian, libasan.so and
# libubsan.so come with gcc (package libgcc-<major>-dev); install it if a partial gcc lacks them.
libasan=$("$CC" -print-file-name=libasan.so)
if [[ $libasan != /* && $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    pkg="libgcc-$("$CC" -dumpversion | cut -d. -f1)-dev"
    log "installing $pkg for libasan"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
    libasan=$("$CC" -print-file-name=libasan.so)
fi
[[ $libasan == /* && -e $libasan ]] || { log "$CC has no libasan.so (got '$libasan')"; exit 2; }
include=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[[ -e $include/Python.h ]] || { log "no Python.h in $include: install python3-dev"; exit 2; }
suffix=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')

work=$(mktemp -d "${TMPDIR:-/tmp}/peerwatch-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
for entry in "${NATIVE_MODULES[@]}"; do
    name=${entry%%=*} source=${entry#*=}
    log "building $source with -fsanitize=address,undefined"
    "$CC" -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined \
        -shared -fPIC -Wall -Wextra -Wno-unused-parameter \
        -Ischemas -I"$include" "$source" -o "$work/$name$suffix"
done

# Leak detection is off: CPython keeps interned strings, caches and module state alive until
# exit on purpose, so LeakSanitizer reports thousands of "leaks" that are not ours. Use-after-
# free, overflows and UB are what this run is for. PYTHONMALLOC=malloc sends Python's own
# allocations through malloc, so ASan sees object bounds too (pymalloc's arenas would hide them).
# The sanitized .so is loaded explicitly by path (--module-dir); PEERWATCH_NATIVE=0 keeps the
# normal build out of the codec so nothing else uses it by accident.
log "fuzzing for ${FUZZ_SECONDS}s"
set +e
env LD_PRELOAD="$libasan" \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1:print_summary=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:abort_on_error=1 \
    PYTHONMALLOC=malloc PEERWATCH_NATIVE=0 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
    "$PYTHON" scripts/fuzz_native.py --module-dir "$work" --seconds "$FUZZ_SECONDS" \
    --last-input "$work/last-input" ${FUZZ_SEED:+--seed "$FUZZ_SEED"} 2>&1 | tee "$work/log"
rc=${PIPESTATUS[0]}
set -e
if grep -qE 'ERROR: AddressSanitizer|runtime error:|SUMMARY: (Address|UndefinedBehavior)Sanitizer' "$work/log"; then
    log "sanitizer report above"
    ((rc)) || rc=1
fi
if ((rc > 1)); then
    log "the driver died (exit $rc); the input it was trying:"
    "$PYTHON" scripts/fuzz_native.py --show-last "$work/last-input" || true
fi
((rc == 0)) && log "ok" || log "FAILED (exit $rc)"
exit "$rc"
