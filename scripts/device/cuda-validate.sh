#!/usr/bin/env bash
# GPU validation of gpucr's cuda backend, run on an NVIDIA machine from the repository
# root with .device/ carried (made by scripts/device/pack.sh on the build machine):
#
#   bash scripts/device/cuda-validate.sh
#
# Every step goes on after a failure and says what failed; the log and a summary go to
# $OUT (the device tool's output folder) or ./gpu-validation-out. Steps:
#   1. the machine: date, kernel and runtime (gVisor reports kernel 4.4.0; Firecracker
#      a real one), GPU, driver, CUDA and PyTorch versions;
#   2. the driver path alone, no CRIU: a PyTorch process holding TENSOR_GIB (default 8)
#      GiB of tensors is locked, checkpointed, restored and unlocked from another process
#      (checkpoint_cycle, gpucr-cuda-driver), tensor checksums compared before and after,
#      and the per-call cost of the loaded driver next to a fresh process's cuInit;
#   3. `criu check` with the carried CRIU;
#   4. end to end, where CRIU runs: that PyTorch process, then a 2-process tree, each
#      dumped by gpucr, killed, restored, checksums compared, timings recorded; next to
#      the same driver calls by hand followed by plain `criu dump` / `criu restore`;
#   5. scripts/bench-parallel-restore.sh on this machine's cores (RUNS=0 skips it).
#
# WORKLOAD=fake runs steps 2-4 with the fake driver and examples/cuda_workload instead
# of PyTorch: the same flow on a machine without a GPU (to check this script).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
dev=$root/.device
out=${OUT:-$root/gpu-validation-out}
mkdir -p "$out"
exec > >(tee -a "$out/validation.log") 2>&1
WORKLOAD=${WORKLOAD:-torch}
TENSOR_GIB=${TENSOR_GIB:-8}
RUNS=${RUNS:-9}
work=$(mktemp -d /tmp/gpucr-validate.XXXXXX)
summary=$out/summary.txt
: > "$summary"

note() { echo "$*" | tee -a "$summary"; }
section() { echo; echo "=== $*"; }
fail() { note "FAIL: $*"; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

# --- the carried build, where the scripts expect it ----------------------------------
if [ ! -x "$dev/bin/gpucr" ]; then
    echo "no $dev/bin/gpucr: run scripts/device/pack.sh on the build machine and carry .device" >&2
    exit 1
fi
mkdir -p target/release/examples
cp "$dev/bin/gpucr" target/release/
cp "$dev"/examples/* target/release/examples/
cp "$dev"/lib/libgpucr_plugin.so "$dev"/lib/libgpucr_fake_cuda.so target/release/
export PATH=$dev/bin:$PATH
export LD_LIBRARY_PATH=$dev/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export GPUCR_CRIU=$dev/bin/criu
gpucr=$root/target/release/gpucr
cycle=$root/target/release/examples/checkpoint_cycle

# --- 1. the machine -------------------------------------------------------------------
section "machine"
kernel=$(uname -r)
runtime="unknown"
case "$kernel" in
4.4.0*) runtime="gVisor (kernel reports $kernel)" ;;
*) if grep -qi firecracker /proc/cmdline /sys/class/dmi/id/* 2>/dev/null || dmesg 2>/dev/null | grep -qi firecracker; then
       runtime="Firecracker (kernel $kernel)"
   else
       runtime="kernel $kernel (not gVisor; Firecracker not named in cmdline/dmi/dmesg)"
   fi ;;
esac
note "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
note "runtime: $runtime"
note "cpus: $(nproc), memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
if command -v nvidia-smi >/dev/null; then
    note "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
else
    note "gpu: none found (no nvidia-smi)"
fi
note "cuda (driver): $(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1)"
note "pytorch: $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1)"
note "carried: $(paste -sd ',' "$dev/VERSIONS" | sed 's/,/, /g')"

# --- the workload ---------------------------------------------------------------------
if [ "$WORKLOAD" = fake ]; then
    export GPUCR_CUDA_LIBRARY=$root/target/release/libgpucr_fake_cuda.so
    export GPUCR_FAKE_CUDA_DIR=$work/fake GPUCR_FAKE_CUDA_GPUS=2
    mkdir -p "$GPUCR_FAKE_CUDA_DIR"
fi

# Start the workload with PROCS processes in its own PID namespace; prints the root's pid.
start_workload() {
    local state=$1 procs=$2 up pid=""
    rm -rf "$state"; mkdir -p "$state"
    if [ "$WORKLOAD" = fake ]; then
        unshare --pid --fork setsid "$root/target/release/examples/cuda_workload" \
            --state "$state" --procs "$procs" --mib 64 </dev/null >/dev/null 2>&1 &
    else
        unshare --pid --fork setsid python3 "$root/scripts/device/torch_tensors.py" \
            --state "$state" --gib "$TENSOR_GIB" --procs "$procs" </dev/null >/dev/null 2>&1 &
    fi
    up=$!
    for _ in $(seq 1800); do
        pid=$(awk '{print $1}' "/proc/$up/task/$up/children" 2>/dev/null || true)
        [ -n "$pid" ] && [ "$(ls "$state"/ready-* 2>/dev/null | wc -l)" -ge "$procs" ] && break
        [ -n "$(ls "$state"/error-* 2>/dev/null)" ] && break
        sleep 0.1
    done
    if [ "$(ls "$state"/ready-* 2>/dev/null | wc -l)" -lt "$procs" ]; then
        cat "$state"/error-* 2>/dev/null | tail -20 >&2
        return 1
    fi
    echo "$pid"
}

# Ask every process of the tree to check its memory (the K-th time); 0 when all match.
check_intact() {
    local state=$1 k=$2 role ok=0
    if [ "$WORKLOAD" = fake ]; then
        echo "$k" > "$state/verify"
        for _ in $(seq 300); do
            ok=1
            for j in "$state"/journal-*; do
                tail -1 "$j" | grep -q "verified=$k " || ok=0
                tail -1 "$j" | grep -q "bad=1" && { echo "bad memory: $j" >&2; return 1; }
            done
            [ $ok = 1 ] && return 0
            sleep 0.1
        done
        return 1
    fi
    for r in "$state"/ready-*; do
        role=${r##*/ready-}
        local pid; pid=$(host_pid_of "$state" "$role") || return 1
        kill -USR1 "$pid"
    done
    for r in "$state"/ready-*; do
        role=${r##*/ready-}
        for _ in $(seq 1200); do [ -f "$state/checksums-$role-$k" ] && break; sleep 0.1; done
        python3 - "$r" "$state/checksums-$role-$k" <<'PY' || return 1
import json, sys
before = json.load(open(sys.argv[1]))["checksums"]
now = json.load(open(sys.argv[2]))
if now["checksums"] != before:
    bad = [i for i, (a, b) in enumerate(zip(before, now["checksums"])) if a != b]
    sys.exit(f"{sys.argv[2]}: tensors {bad} differ")
print(f"{sys.argv[2]}: {len(before)} tensors match, work counter {now['work']}")
PY
    done
}

# The host pid of ROLE's process in the tree whose state is in STATE (the torch
# processes know only their namespace pids).
host_pid_of() {
    local state=$1 role=$2
    for p in $(pgrep -f "torch_tensors.py --state $state" ); do
        if [ "$role" = parent ]; then
            tr '\0' ' ' < "/proc/$p/cmdline" | grep -q -- "--role" || { echo "$p"; return 0; }
        else
            tr '\0' ' ' < "/proc/$p/cmdline" | grep -q -- "--role $role" && { echo "$p"; return 0; }
        fi
    done
    return 1
}

kill_tree() { [ -n "${1:-}" ] && kill -KILL "$1" 2>/dev/null; sleep 0.5; }

# --- 2. the driver path alone ---------------------------------------------------------
section "driver path alone (no CRIU): lock, checkpoint, restore, unlock from another process"
state=$work/driver
if pid=$(start_workload "$state" 1); then
    check_intact "$state" 1 || fail "checksums before the cycle"
    if "$cycle" "$pid" --repeat 1000 --hold-ms 1000 | tee "$out/driver-cycle.jsonl"; then
        if check_intact "$state" 2; then
            note "PASS driver path: $(grep -h summary "$out/driver-cycle.jsonl")"
            grep -hE '"(lock|checkpoint|restore|unlock|load\+cuInit)"' "$out/driver-cycle.jsonl" | tee -a "$summary"
        else
            fail "driver path: tensors differ after restore+unlock"
        fi
    else
        fail "driver path: checkpoint_cycle failed"
    fi
    # A fresh process for each call pays loading the driver and cuInit every time.
    fresh=$(date +%s%N)
    for _ in 1 2 3 4 5; do "$cycle" "$pid" --repeat 1 >/dev/null 2>&1 || true; done
    note "fresh process per cycle (load + cuInit + 8 calls), mean of 5: $(( $(ms_since "$fresh") / 5 )) ms"
    kill_tree "$pid"
else
    fail "the workload did not start"
fi

# --- 3. criu check ----------------------------------------------------------------------
section "criu check"
criu --version | tee -a "$summary"
criu check 2>&1 | tail -15 | tee "$out/criu-check.txt"
note "criu check: $(tail -1 "$out/criu-check.txt")"

# --- 4. end to end ----------------------------------------------------------------------
end_to_end() {
    local name=$1 procs=$2 state=$work/e2e-$1 img=$work/img-$1 pid t restored
    section "end to end: $name ($procs process(es))"
    pid=$(start_workload "$state" "$procs") || { fail "$name: the workload did not start"; return; }
    check_intact "$state" 1 || fail "$name: checksums before the dump"
    rm -rf "$img"
    t=$(date +%s%N)
    if ! "$gpucr" dump "$pid" "$img" > "$out/dump-$name.txt" 2>&1; then
        cat "$out/dump-$name.txt"; tail -30 "$img/dump.log" 2>/dev/null
        fail "$name: gpucr dump failed"; kill_tree "$pid"; return
    fi
    note "$name: gpucr dump $(ms_since "$t") ms, image $(du -sh "$img" | cut -f1)"
    kill_tree "$pid"
    t=$(date +%s%N)
    if ! restored=$("$gpucr" restore --detach "$img" 2> "$out/restore-$name.txt"); then
        cat "$out/restore-$name.txt"; tail -30 "$img/restore.log" 2>/dev/null
        fail "$name: gpucr restore failed"; return
    fi
    note "$name: gpucr restore $(ms_since "$t") ms (root pid $restored)"
    if check_intact "$state" 2; then note "PASS $name: checksums match after restore"; else fail "$name: checksums after restore"; fi
    "$gpucr" inspect "$img" > "$out/inspect-$name.txt" 2>&1
    kill_tree "$restored"
}
end_to_end single 1
end_to_end tree 2

# The same by hand, as CRIU's own cuda route does it: the driver calls from another
# process (checkpoint_cycle), then plain `criu dump` / `criu restore` with no plugin.
section "by hand: lock+checkpoint, plain criu dump, kill, plain criu restore, restore+unlock"
state=$work/byhand img=$work/img-byhand
mkdir -p "$work/no-plugins"
if pid=$(start_workload "$state" 1); then
    check_intact "$state" 1 || fail "by hand: checksums before the dump"
    rm -rf "$img"; mkdir -p "$img"
    t=$(date +%s%N)
    if "$cycle" "$pid" --steps checkpoint --repeat 1 >/dev/null &&
        criu dump -t "$pid" -D "$img" -o dump.log --libdir "$work/no-plugins" >/dev/null 2>&1; then
        note "by hand: lock+checkpoint+criu dump $(ms_since "$t") ms, image $(du -sh "$img" | cut -f1)"
        kill_tree "$pid"
        t=$(date +%s%N)
        if criu restore -D "$img" -d -o restore.log --libdir "$work/no-plugins" \
                --pidfile "$work/byhand.pid" >/dev/null 2>&1 &&
            "$cycle" "$(cat "$work/byhand.pid")" --steps restore --repeat 1 >/dev/null; then
            note "by hand: criu restore+restore+unlock $(ms_since "$t") ms"
            check_intact "$state" 2 && note "PASS by hand: checksums match" || fail "by hand: checksums after restore"
            kill_tree "$(cat "$work/byhand.pid")"
        else
            fail "by hand: restore: $(grep Error "$img/restore.log" 2>/dev/null | tail -3)"
        fi
    else
        fail "by hand: dump: $(grep Error "$img/dump.log" 2>/dev/null | tail -3)"
        kill_tree "$pid"
    fi
fi

# --- 5. parallel restore on this machine's cores ------------------------------------
if [ "$RUNS" -gt 0 ]; then
    section "parallel restore benchmark ($(nproc) cores, RUNS=$RUNS)"
    RUNS=$RUNS scripts/bench-parallel-restore.sh 2>&1 | tail -40 | tee "$out/bench-parallel-restore.txt"
fi

section "summary"
cat "$summary"
rm -rf "$work"
