#!/usr/bin/env bash
# The regression run of docs/benchmarks.md, in one go: GPU memory dump throughput
# (bench-transfer.sh), parallel restore of GPU memory (bench-parallel-restore.sh) and
# gpucr vs plain CRIU on a CPU-only tree (bench-dump-restore.sh), each interleaving its
# commands over RUNS rounds (default 9), one after the other on the same build, with the
# machine and commit printed first. Each script runs its commands in a session of its
# own at scheduler-group nice $NICE (default -15).
#
#   scripts/bench-all.sh 2>&1 | tee /var/tmp/bench-all.log
set -euo pipefail
cd "$(dirname "$0")/.."
export RUNS=${RUNS:-9}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (modified)'), RUNS=$RUNS"
echo "# $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), Linux $(uname -r), $(criu --version | head -1)"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
cargo build --release --workspace --lib --bins --examples -q
for bench in bench-transfer bench-parallel-restore bench-dump-restore; do
    echo
    echo "## $bench"
    "scripts/$bench.sh"
done
echo
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
