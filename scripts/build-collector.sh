#!/usr/bin/env bash
# Build the minimal OpenTelemetry Collector used by peerwatch's integration tests
# (docker/collector: OTLP receiver -> batch -> file/Prometheus/debug exporters).
#
# The binary, the Go module cache and the Go build cache live OUTSIDE the repo, under
#   ${PEERWATCH_CACHE_DIR:-$HOME/.cache/peerwatch}/otelcol/
# so CI on the same machine reuses downloads and compiled packages. Idempotent: exits at
# once when the binary for this version already exists (pass --force to rebuild).
# The last line of stdout is the binary's path. Needs Go >= 1.26 and the Go module proxy.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src_dir="${repo_root}/docker/collector"
cache_root="${PEERWATCH_CACHE_DIR:-$HOME/.cache/peerwatch}/otelcol"

force=0
if [[ "${1:-}" == "--force" ]]; then force=1; fi

# The collector core release pinned in go.mod names the cache folder, so bumping it builds anew.
version="$(awk '$1 == "go.opentelemetry.io/collector/otelcol" {print $2}' "${src_dir}/go.mod")"
if [[ -z "${version}" ]]; then
  echo "build-collector: cannot read the otelcol version from ${src_dir}/go.mod" >&2
  exit 2
fi
# The component set (main.go, go.mod) names it too: adding an exporter must not reuse an old binary.
sources_hash="$(cat "${src_dir}/main.go" "${src_dir}/go.mod" | sha256sum | cut -c1-12)"
out_dir="${cache_root}/${version#v}-${sources_hash}"
binary="${out_dir}/peerwatch-otelcol"

if [[ -x "${binary}" && "${force}" -eq 0 ]]; then
  echo "build-collector: ${binary} exists, skipping build" >&2
  echo "${binary}"
  exit 0
fi

# The Go toolchain of this machine kind lives in /usr/local/go; a login PATH may lack it.
if [[ -x /usr/local/go/bin/go ]]; then export PATH="$PATH:/usr/local/go/bin"; fi
command -v go >/dev/null || { echo "build-collector: 'go' not found on PATH (install Go >= 1.24)" >&2; exit 2; }
mkdir -p "${out_dir}"

export GOPATH="${cache_root}/go"
export GOMODCACHE="${cache_root}/go/mod"
export GOCACHE="${cache_root}/go-build"
export GOFLAGS="-mod=mod"
export CGO_ENABLED=0
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

start_s=$(date +%s)
echo "build-collector: building ${version} into ${out_dir} ($(go version))" >&2
tmp_binary="${binary}.tmp.$$"
trap 'rm -f "${tmp_binary}"' EXIT
(
  cd "${src_dir}"
  go build -trimpath -ldflags "-s -w -X main.version=${version}" -o "${tmp_binary}" .
)
# Rename last so a cut-short build never leaves a half-written binary that looks finished.
mv "${tmp_binary}" "${binary}"
echo "build-collector: built in $(( $(date +%s) - start_s )) s" >&2
echo "${binary}"
