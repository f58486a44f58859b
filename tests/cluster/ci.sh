#!/usr/bin/env bash
# CI entry point for the local control plane. Idempotent; safe to run on every CI job.
#
#   tests/cluster/ci.sh build          build the binaries into the cache (no-op when cached): Kueue's,
#                                      so no test sits silent for minutes building it, and the real
#                                      node's (tests/e2e/test_real_node.py needs them), and SeaweedFS's
#                                      `weed`, the S3 server of the object-store tests
#   tests/cluster/ci.sh e2e [ARGS...]  build, then run the cluster-marked tests (pytest ARGS appended);
#                                      on failure names the log folder (each failed test's report
#                                      shows what the components logged during it)
#
# Env: PYTHON (default .venv/bin/python), ASYNCGRPO_CACHE (cache root, default ~/.cache/asyncgrpo),
# ASYNCGRPO_CLUSTER_STATE (state folder), ASYNCGRPO_BUILD_TIMEOUT (seconds, default 5400: the
# first build on a fresh 2-core machine took 23.4 min under load 4-8, the real node's about 15 more
# under load 13-20, see docs/benchmarks.md; SeaweedFS's about 18 more).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-.venv/bin/python}"

build() {
  timeout "${ASYNCGRPO_BUILD_TIMEOUT:-5400}" "$PY" -m tests.cluster build --kueue --real-node --s3
}

print_logs() {
  echo "=== each failed test's report above shows what the components logged during it; all logs: $("$PY" -m tests.cluster logs)"
}

case "${1:-build}" in
  build)
    build
    ;;
  e2e)
    shift || true
    build
    if ! "$PY" -m pytest -m cluster -p no:cacheprovider "$@"; then
      print_logs
      exit 1
    fi
    ;;
  *)
    echo "usage: $0 build | e2e [pytest args]" >&2
    exit 2
    ;;
esac
