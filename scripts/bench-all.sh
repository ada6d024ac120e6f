#!/usr/bin/env bash
# The regression run of docs/benchmarks.md, in one go: GPU memory dump throughput
# (bench-transfer.sh), parallel restore of GPU memory (bench-parallel-restore.sh), gpucr
# vs plain CRIU on a CPU-only tree (bench-dump-restore.sh) and, where podman is
# installed, engine mode (bench-engine.sh), each interleaving its commands over RUNS
# rounds (default 9), one after the other on the same build, with the machine and commit
# printed first. Each script runs its commands in a session of its own at
# scheduler-group nice $NICE (default -15).
#
# Each script ends its output with lines `ROW|benchmark|target|result|PASS, FAIL or -`;
# at the end this prints them as a Markdown table in the column order of the opening
# table of docs/benchmarks.md: benchmark | target | result on this machine | date | commit.
# A script that fails, or is not run, gets a row that says so.
#
#   scripts/bench-all.sh 2>&1 | tee /var/tmp/bench-all.log
set -euo pipefail
cd "$(dirname "$0")/.."
export RUNS=${RUNS:-9}
date=$(date -u '+%Y-%m-%d')
commit="\`$(git rev-parse --short HEAD)\`$(git diff --quiet || echo ' (modified)')"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit, RUNS=$RUNS"
echo "# $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), Linux $(uname -r), $(criu --version | head -1)"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
cargo build --release --workspace --lib --bins --examples -q

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
: >"$out/rows"

# Runs one benchmark script, its stdout also kept, and collects its ROW lines; a script
# that fails gets a FAIL row of its own (under the name of its first row, if any).
run_bench() { # name-for-a-failure script [args...]
    local name=$1 script=$2 status=0; shift 2
    echo
    echo "## $script $*"
    "scripts/$script.sh" "$@" | tee "$out/$script.out" || status=$?
    grep '^ROW|' "$out/$script.out" >>"$out/rows" || true
    if [ "$status" != 0 ]; then
        echo "ROW|$name|-|$script.sh failed (exit status $status): see its output|FAIL" >>"$out/rows"
    fi
}

run_bench "GPU dump throughput" bench-transfer
run_bench "Parallel restore" bench-parallel-restore
run_bench "CPU-only dump and restore vs plain CRIU" bench-dump-restore
if command -v podman >/dev/null && command -v runc >/dev/null; then
    run_bench "Engine mode" bench-engine --runs "$RUNS"
else
    echo "ROW|Engine mode|(podman with GPU - without) <= 1.1 x (gpucr dump with GPU - without)|not run: podman or runc is not installed (scripts/setup.sh)|-" >>"$out/rows"
fi

echo
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| benchmark | target | result on this machine | date | commit |"
echo "|---|---|---|---|---|"
while IFS='|' read -r _ name target result verdict; do
    case $verdict in
        PASS) result="$result: **met**" ;;
        FAIL) result="$result: **not met**" ;;
    esac
    echo "| $name | $target | $result | $date | $commit |"
done <"$out/rows"
