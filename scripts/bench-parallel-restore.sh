#!/usr/bin/env bash
# Benchmark: restore wall time with gpucr's parallel restore (the GPU image is read,
# verified and decompressed from the start, while CRIU restores CPU memory) against
# --no-parallel-restore (buffers filled inside RESTORE_EXT_FILE, CRIU 4.1's way), on the
# simulator with copy engines throttled to 1.6 GB/s per GPU, for one process and for a
# 4-process tree, side by side in one hyperfine run each, median of RUNS runs.
# Results: docs/benchmarks.md.
#
#   scripts/bench-parallel-restore.sh            (RUNS=7)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
RUNS=${RUNS:-7}
WORK=${WORK:-/var/tmp/gpucr-bench-parallel}
export GPUCR_SIM_ROOT=${GPUCR_SIM_ROOT:-/dev/shm/gpucr-bench-sim}
export GPUCR_SIM_COPY_BW=${GPUCR_SIM_COPY_BW:-1.6GB/s}
gpucr=$root/target/release/gpucr
workload=$root/target/release/examples/sim_workload

kill_restored() {
    [ -f "$WORK/restored" ] || return 0
    local pid; pid=$(cat "$WORK/restored")
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 200); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
    rm -f "$WORK/restored"
}

case "${1:-}" in
prepare)
    # Before each restore: no restored tree, the tree's files as at the dump, and no
    # device memory (as on a new machine).
    kill_restored
    rm -rf "$WORK/state" && cp -a "$WORK/state-at-dump" "$WORK/state"
    rm -rf "$GPUCR_SIM_ROOT/contexts"
    rm -f "$WORK/image/restore.log" "$WORK/image/stats-restore"
    exit 0 ;;
restore)
    shift
    "$gpucr" restore --detach "$@" "$WORK/image" > "$WORK/restored"
    exit 0 ;;
timeline)
    shift
    "$0" prepare
    "$gpucr" restore --detach --json "$@" "$WORK/image" > "$WORK/timeline.json"
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$WORK/timeline.json" > "$WORK/restored"
    python3 - "$WORK/timeline.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ev = r["events"]
for a, b in zip(ev, ev[1:]):
    print(f"    {b['at_ms'] - a['at_ms']:8.1f} ms  {a['name']} -> {b['name']}")
print(f"    {r['total_ms']:8.1f} ms  total")
for t in (r.get("gpu") or {}).get("timings", []):
    print(f"    task {t['ns_pid']}: {t['bytes'] / 2**20:.0f} MiB of device memory filled "
          f"{t['start_ms']:.1f} -> {t['end_ms']:.1f} ms (helper clock)")
PY
    "$0" prepare >/dev/null
    exit 0 ;;
"") ;;
*) echo "unknown step $1" >&2; exit 2 ;;
esac

command -v hyperfine >/dev/null || apt-get install -y -qq hyperfine >/dev/null
[ -x "$gpucr" ] && [ -x "$workload" ] || cargo build --release --workspace --lib --bins --examples -q
self=$root/scripts/bench-parallel-restore.sh
export WORK

run_case() {
    local name=$1; shift
    kill_restored
    rm -rf "$WORK" "$GPUCR_SIM_ROOT" && mkdir -p "$WORK/state"
    unshare --pid --fork setsid "$workload" --state "$WORK/state" "$@" </dev/null >/dev/null 2>&1 &
    local up=$! pid=""
    for _ in $(seq 1200); do
        pid=$(awk '{print $1}' "/proc/$up/task/$up/children" 2>/dev/null || true)
        [ -n "$pid" ] && [ -f "$WORK/state/ready-parent" ] && break
        sleep 0.05
    done
    sleep 2
    "$gpucr" dump "$pid" "$WORK/image" > "$WORK/dump.txt"
    for _ in $(seq 200); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
    cp -a "$WORK/state" "$WORK/state-at-dump"
    echo "## $name: $*"
    sed -n '1,2p' "$WORK/dump.txt"
    echo "image: $(du -sh "$WORK/image" | cut -f1) ($(du -sh "$WORK/image/gpu" | cut -f1) of it GPU memory)"
    hyperfine --runs "$RUNS" --export-json "$WORK/../parallel-$name.json" \
        --prepare "$self prepare" -n "sequential (--no-parallel-restore)" "$self restore --no-parallel-restore" \
        --prepare "$self prepare" -n "parallel" "$self restore"
    echo "timeline, parallel:"
    "$self" timeline
    echo "timeline, sequential:"
    "$self" timeline --no-parallel-restore
    kill_restored
}

# GPU memory random (stored raw: reading and checking it costs what restoring as much
# CPU memory does), in buffers of at most 128 MiB spread over 3 GPUs.
run_case single --cpu-mib 512 --parent-mib 512 --child-mib 0 --gpus 3 --fill random --max-buffer-mib 128
run_case tree --cpu-mib 128 --parent-mib 128 --child-mib 128 --children 3 --gpus 3 --fill random --max-buffer-mib 128
rm -rf "$GPUCR_SIM_ROOT"

python3 - "$WORK/../parallel-single.json" "$WORK/../parallel-tree.json" <<'PY'
import json, sys
for path in sys.argv[1:]:
    seq, par = json.load(open(path))["results"]
    gain = 1 - par["median"] / seq["median"]
    print(f"{path.split('parallel-')[-1][:-5]:>7}: sequential median {seq['median']*1000:7.1f} ms, "
          f"parallel median {par['median']*1000:7.1f} ms: {gain*100:.0f}% faster")
PY
