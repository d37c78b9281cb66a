#!/usr/bin/env bash
# Install what a fresh machine lacks to run peerwatch here: Java + Maven (for the local Kafka),
# a Python virtualenv with peerwatch and its test extras. Idempotent; downloads are cached outside
# the repository (pip: ~/.cache/pip, Kafka jars: ~/.cache/peerwatch, Maven: ~/.m2).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'setup: %s\n' "$*" >&2; }

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        log "please install: ${missing[*]} (needs root)"; exit 1
    fi
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    log "peerwatch needs Python >= 3.11 (found $("$PYTHON" --version 2>&1))"; exit 1
fi
if [[ ! -x .venv/bin/python ]]; then
    log "creating .venv"
    "$PYTHON" -m venv .venv
fi
# The C decoder (schemas/_avro_native.c) needs a C compiler; without one it is skipped and the
# codec uses its Python reader (slower, same results).
native_deps=()
command -v cc >/dev/null 2>&1 || native_deps+=(gcc)
# Python.h: Debian's python3 keeps it in python3-dev (a python built from source has it).
"$PYTHON" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    || native_deps+=(python3-dev)
if ((${#native_deps[@]})) && [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    log "installing ${native_deps[*]} for the native Avro decoder"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${native_deps[@]}" >/dev/null
fi
stamp=.venv/.peerwatch-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp || schemas/_avro_native.c -nt $stamp || schemas/avro_reader.h -nt $stamp ]]; then
    log "installing peerwatch and its dependencies into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[dev]'
    touch "$stamp"
fi
if ! .venv/bin/python -c 'from peerwatch.schemas import native; raise SystemExit(not native.available())'; then
    log "note: the native Avro decoder is not built (no C compiler or Python headers); decoding is slower"
fi
log "ready: .venv/bin/peerwatch"
