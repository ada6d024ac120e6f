#!/usr/bin/env bash
# Benchmark: the cuda backend's lock + checkpoint wall time, and restore + unlock wall
# time, for a 4-process tree against one process, side by side in one run (the two
# cases alternate, ROUNDS times each), with real CRIU and the fake CUDA driver. Every
# driver step takes STEP_MS in its target (GPUCR_FAKE_CUDA_STEP_MS: the driver's own
# work), so what is measured is how the steps of several processes are laid out:
# handled one after another (as CRIU's cuda plugin does), four processes would take four
# times as long; gpucr locks every process of the tree at once before the freeze,
# checkpoints them at once when it is frozen, and on restore brings them back at once.
#
# The times come from the fake's call log (GPUCR_FAKE_CUDA_LOG, CLOCK_MONOTONIC):
# lock wall time = first lock's start to last lock's end; checkpoint wall time, the
# same for the checkpoints; their sum is compared; on restore, the same for the
# driver's restores and unlocks. Target: the tree at most 1.3x one process. Results:
# docs/benchmarks.md.
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

# One dump of a tree of $1 CUDA processes, then its restore; appends "procs lock_ms
# checkpoint_ms dump_ms restore_ms unlock_ms whole_restore_ms" to $WORK/results.
run_one() {
    local procs=$1 fake=$WORK/fake state=$WORK/state image=$WORK/image
    rm -rf "$fake" "$state" "$image" "$WORK/calls.log" "$WORK/restore-calls.log"
    mkdir -p "$fake" "$state"
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
    local dump_ms=$(( (t1 - t0) / 1000000 ))
    kill -KILL "$pid" 2>/dev/null || true
    wait "$up" 2>/dev/null || true
    local restored
    sync
    t0=$(date +%s%N)
    restored=$(GPUCR_FAKE_CUDA_DIR=$fake GPUCR_FAKE_CUDA_LOG=$WORK/restore-calls.log \
        "$gpucr" restore --detach "$image" 2>"$WORK/restore.txt")
    t1=$(date +%s%N)
    local restore_ms=$(( (t1 - t0) / 1000000 ))
    # The restored root is its PID namespace's init: killing it ends the tree.
    kill -KILL "$restored" 2>/dev/null || true
    while kill -0 "$restored" 2>/dev/null; do sleep 0.05; done
    python3 - "$WORK/calls.log" "$WORK/restore-calls.log" "$procs" \
        "$dump_ms" "$restore_ms" >> "$WORK/results" <<'PY'
import sys
def calls(path):
    made = {}
    for line in open(path):
        f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if f["result"] == "CUDA_SUCCESS":
            made.setdefault(f["fn"], []).append((int(f["start_ns"]), int(f["end_ns"])))
    return made
def wall(made, name):
    spans = made[name]
    assert len(spans) == int(sys.argv[3]), (name, spans)
    return f"{(max(e for _, e in spans) - min(s for s, _ in spans)) / 1e6:.1f}"
dump, restore = calls(sys.argv[1]), calls(sys.argv[2])
print(sys.argv[3], wall(dump, "cuCheckpointProcessLock"),
      wall(dump, "cuCheckpointProcessCheckpoint"), sys.argv[4],
      wall(restore, "cuCheckpointProcessRestore"),
      wall(restore, "cuCheckpointProcessUnlock"), sys.argv[5])
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
    lock, ckpt, dump, rest, unlock, restore = (statistics.median(c) for c in zip(*r))
    med[procs] = (lock + ckpt, rest + unlock)
    print(f"{procs} process(es): lock {lock:7.1f} ms + checkpoint {ckpt:7.1f} ms = "
          f"{lock + ckpt:7.1f} ms (median); whole gpucr dump {dump:7.1f} ms")
    print(f"    restore {rest:7.1f} ms + unlock {unlock:7.1f} ms = {rest + unlock:7.1f} ms "
          f"(median); whole gpucr restore {restore:7.1f} ms")
    print("    runs (lock+checkpoint ms): " + " ".join(f"{x[0] + x[1]:.1f}" for x in r))
    print("    runs (restore+unlock ms): " + " ".join(f"{x[3] + x[4]:.1f}" for x in r))
for what, i in (("dump", 0), ("restore", 1)):
    ratio = med["4"][i] / med["1"][i]
    print(f"{what}: 4-process tree / 1 process: {ratio:.2f}x (target <= 1.3x): "
          + ("met" if ratio <= 1.3 else "NOT met"))
PY
rm -rf "$WORK/fake" "$WORK/image" "$WORK/state"
