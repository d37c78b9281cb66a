#!/usr/bin/env bash
# The whole test suite on real services: sets up, starts Kafka and Slurm (unless
# PEERWATCH_KAFKA_BOOTSTRAP names a cluster), runs pytest, stops what it started.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/unit -k codec).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

started_kafka=0
cleanup() {
    if ((started_kafka)); then .venv/bin/peerwatch kafka stop || true; fi
    if [[ ${PEERWATCH_KEEP_SLURM:-0} != 1 ]]; then bash scripts/slurm-down.sh || true; fi
}
trap cleanup EXIT

if [[ -z ${PEERWATCH_KAFKA_BOOTSTRAP:-} ]]; then
    if ! .venv/bin/peerwatch kafka status >/dev/null 2>&1; then
        .venv/bin/peerwatch kafka start
        started_kafka=1
    fi
    export PEERWATCH_KAFKA_BOOTSTRAP=127.0.0.1:9092
fi
bash scripts/slurm-up.sh
# The incident report is checked by rendering it in Debian's headless Chromium.
if ! command -v chromium >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
# The Alertmanager tests run Debian's Alertmanager (and its amtool) as a plain process.
if ! command -v prometheus-alertmanager >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus-alertmanager >/dev/null
fi
# Prometheus (and promtool) for the Prometheus tests: Debian's package, run as a plain process by
# the tests through peerwatch.local.prometheus (the package's own service is not used).
if ! command -v prometheus >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends prometheus >/dev/null
fi
# The systemd unit tests run systemd-analyze verify (Debian's systemd; the image usually has it).
if ! command -v systemd-analyze >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends systemd >/dev/null
fi
# The OpenTelemetry Collector the exporter tests talk to is built once from the Go module proxy.
bash scripts/build-collector.sh >/dev/null

# The C decoder must be there in CI (a silent fallback would hide a broken build).
export PEERWATCH_REQUIRE_NATIVE="${PEERWATCH_REQUIRE_NATIVE:-1}"
# pytest exits 5 when it collected no test: that is a failure here, like any other non-zero code.
.venv/bin/python -m pytest "${@:-tests}"
