#!/usr/bin/env bash
# Benchmark: gpucr dump/restore against plain CRIU (scripts/bench-dump-restore.sh: the
# sample workload, CPU only, interleaved rounds, ratios per round) with each CRIU gpucr
# is tested with, one after the other in one run: CRIU 4.2.1 (the installed one) and
# criu-dev 2cf8f13 (the branch CRIU 4.3 was cut from), built side by side by
# scripts/install-criu.sh --version. Results: docs/benchmarks.md.
#
#   scripts/bench-criu-versions.sh          (as root; MEM_MIB=1024 RUNS=9 as in
#                                            bench-dump-restore.sh; VERSIONS="4.2.1 dev-2cf8f13")
#
# Each version's CRIU is first on PATH and named by GPUCR_CRIU, so that both gpucr and the
# plain `criu` command line run it.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSIONS=${VERSIONS:-"4.2.1 dev-2cf8f13"}

criu_for() {
    case $1 in
        4.2.1)
            # The installed CRIU when it is 4.2.1; otherwise a side-by-side build.
            if [ "$(criu --version 2>/dev/null | sed -n 's/^Version: *//p')" = 4.2.1 ]; then
                command -v criu
                return
            fi ;;
    esac
    scripts/install-criu.sh --version "$1" >&2
    echo "/opt/gpucr/criu/$1/bin/criu"
}

for version in $VERSIONS; do
    criu=$(criu_for "$version")
    [ -x "$criu" ] || { echo "bench-criu-versions: no CRIU $version at $criu" >&2; exit 1; }
    echo "## CRIU $version ($criu, reports $("$criu" --version | sed -n 's/^Version: *//p'))"
    PATH=$(dirname "$criu"):$PATH GPUCR_CRIU=$criu WORK=/var/tmp/gpucr-bench-$version \
        scripts/bench-dump-restore.sh
done
