#!/usr/bin/env bash
# Benchmark: the cuda backend's lock + checkpoint wall time for a 4-process tree against
# one process, side by side in one run (the two cases alternate, ROUNDS times each),
# with real CRIU and the fake CUDA driver. Every driver step takes STEP_MS in its target
# (GPUCR_FAKE_CUDA_STEP_MS: the driver's own work), so what is measured is how the steps
# of several processes are laid out: handled one after another (as CRIU's cuda plugin
# does), four processes would take four times as long; gpucr locks every process of the
# tree at once before the freeze and checkpoints them at once when it is frozen.
#
# The times come from the fake's call log (GPUCR_FAKE_CUDA_LOG, CLOCK_MONOTONIC):
# lock wall time = first lock's start to last lock's end; checkpoint wall time, the
# same for the checkpoints; their sum is compared. Target: the tree at most 1.3x one
# process. Results: docs/benchmarks.md.
#
#   scripts/bench-cuda-tree.sh            (ROUNDS=7 STEP_MS=200 MIB=16)
#   TARGET_DIR=target/debug scripts/bench-cuda-tree.sh   (an already built profile)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
ROUNDS=${ROUNDS:-7}
STEP_MS=${STEP_MS:-200}
MIB=${MIB:-16}
WORK=${WORK:-/var/tmp/gpucr-bench-cuda-tree}
TARGET_DIR=${TARGET_DIR:-target/release}
gpucr=$root/$TARGET_DIR/gpucr
workload=$root/$TARGET_DIR/examples/cuda_workload
library=$root/$TARGET_DIR/libgpucr_fake_cuda.so

if ! [ -x "$gpucr" ] || ! [ -x "$workload" ] || ! [ -f "$library" ]; then
    [ "$TARGET_DIR" = target/release ] || { echo "$TARGET_DIR is not built" >&2; exit 2; }
    cargo build --release --workspace --lib --bins --examples -q
fi
export GPUCR_CUDA_LIBRARY=$library

# One dump of a tree of $1 CUDA processes; appends "procs lock_ms checkpoint_ms dump_ms"
# to $WORK/results.
run_one() {
    local procs=$1 fake=$WORK/fake state=$WORK/state image=$WORK/image
    rm -rf "$fake" "$state" "$image" "$WORK/calls.log" && mkdir -p "$fake" "$state"
    GPUCR_FAKE_CUDA_DIR=$fake GPUCR_FAKE_CUDA_STEP_MS=$STEP_MS \
        unshare --pid --fork setsid "$workload" --state "$state" --procs "$procs" --mib "$MIB" \
        </dev/null >/dev/null 2>&1 &
    local up=$! pid="" ready=0
    for _ in $(seq 1200); do
        pid=$(awk '{print $1}' "/proc/$up/task/$up/children" 2>/dev/null || true)
        ready=$(find "$state" -name 'ready-*' | wc -l)
        [ -n "$pid" ] && [ "$ready" -ge "$procs" ] && break
        sleep 0.05
    done
    [ "$ready" -ge "$procs" ] || { echo "the workload did not start" >&2; exit 1; }
    sleep 0.5
    local t0 t1
    t0=$(date +%s%N)
    GPUCR_FAKE_CUDA_DIR=$fake GPUCR_FAKE_CUDA_LOG=$WORK/calls.log \
        "$gpucr" dump "$pid" "$image" >"$WORK/dump.txt" 2>&1
    t1=$(date +%s%N)
    kill -KILL "$pid" 2>/dev/null || true
    wait "$up" 2>/dev/null || true
    python3 - "$WORK/calls.log" "$procs" "$(( (t1 - t0) / 1000000 ))" >> "$WORK/results" <<'PY'
import sys
calls = {}
for line in open(sys.argv[1]):
    f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
    if f["result"] == "CUDA_SUCCESS":
        calls.setdefault(f["fn"], []).append((int(f["start_ns"]), int(f["end_ns"])))
def wall(name):
    spans = calls[name]
    assert len(spans) == int(sys.argv[2]), (name, spans)
    return (max(e for _, e in spans) - min(s for s, _ in spans)) / 1e6
print(sys.argv[2], f"{wall('cuCheckpointProcessLock'):.1f}",
      f"{wall('cuCheckpointProcessCheckpoint'):.1f}", sys.argv[3])
PY
}

rm -rf "$WORK" && mkdir -p "$WORK"
for round in $(seq "$ROUNDS"); do
    run_one 1
    run_one 4
    echo "round $round of $ROUNDS done" >&2
done

echo "fake driver step ${STEP_MS} ms, ${MIB} MiB of device memory per process, $ROUNDS rounds"
python3 - "$WORK/results" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
med = {}
for procs in ("1", "4"):
    r = [list(map(float, row[1:])) for row in rows if row[0] == procs]
    lock, ckpt, dump = (statistics.median(c) for c in zip(*r))
    med[procs] = lock + ckpt
    print(f"{procs} process(es): lock {lock:7.1f} ms + checkpoint {ckpt:7.1f} ms = "
          f"{lock + ckpt:7.1f} ms (median); whole gpucr dump {dump:7.1f} ms")
    print("    runs (lock+checkpoint ms): " + " ".join(f"{a + b:.1f}" for a, b, _ in r))
ratio = med["4"] / med["1"]
print(f"4-process tree / 1 process: {ratio:.2f}x (target <= 1.3x): "
      + ("met" if ratio <= 1.3 else "NOT met"))
PY
rm -rf "$WORK/fake" "$WORK/image" "$WORK/state"
