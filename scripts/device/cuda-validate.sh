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
#   5. a 4-process tree against one process (TREE_GIB each, default 2, ROUNDS rounds,
#      default 3, alternating): lock+checkpoint wall time from the manifests' operation
#      logs, whole dump and restore times, checksums after every restore;
#   6. on-demand restore (`gpucr restore --lazy`) of the PyTorch process (TENSOR_GIB):
#      ROUNDS rounds of a plain restore, a lazy one whose staged memory gpucr brings in
#      before the driver's restore (the default), and a lazy one that leaves it to the
#      driver's reads through the userfaultfd (GPUCR_LAZY_STAGING=lazy): time to resume
#      (the timeline up to criu-done), time until all memory is in, bytes on fault,
#      checksums after each; whether the driver copes with memory registered with a
#      userfaultfd is recorded in the summary;
#   7. live migration (`gpucr migrate`, stop-and-copy and --post-copy) of the PyTorch
#      process between two network namespaces of this machine, checksums compared on
#      the destination, the figures of `migrate --json` recorded;
#   8. scripts/bench-parallel-restore.sh and scripts/bench-dump-restore.sh on this
#      machine's cores (RUNS each, default 9; RUNS=0 skips them).
#
# LAUNCH (auto, pidns, plain) says how workloads start; see below. STEPS picks steps
# (default "driver criu e2e byhand versus faults guard engine tree4 lazy migrate parallel cpu"; versus:
# gpucr against the by-hand route, ROUNDS rounds interleaved; guard: gpucr killed with
# SIGKILL during a dump and during a restore; engine: engine mode, CRIU run by hand as
# runc runs it). Each step has
# a time limit (STEP_TIMEOUT seconds per command, default 300; BENCH_TIMEOUT per
# benchmark, default 480). The log and the summary
# are written as the steps go; every other output (gpucr's and CRIU's logs, manifests,
# inspect output) is in $OUT/details.tgz, refreshed after each step, since the device
# tool brings back at most 8 files.
#
# WORKLOAD=fake runs steps 2-4 with the fake driver and examples/cuda_workload instead
# of PyTorch: the same flow on a machine without a GPU (to check this script).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
dev=$root/.device
out=${OUT:-$root/gpu-validation-out}
mkdir -p "$out"
exec > >(tee -a "$out/validation.log") 2>&1
WORKLOAD=${WORKLOAD:-torch}
TENSOR_GIB=${TENSOR_GIB:-8}
TREE_GIB=${TREE_GIB:-2}
ROUNDS=${ROUNDS:-3}
RUNS=${RUNS:-9}
STEPS=${STEPS:-driver criu e2e byhand versus faults guard engine tree4 lazy migrate parallel cpu}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-480}
# Images go to disk (/var/tmp), as a user's would; each is removed after its step.
work=$(mktemp -d /var/tmp/gpucr-validate.XXXXXX)
details=$work/details
mkdir -p "$details"
summary=$out/summary.txt
: > "$summary"

wanted() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
save_details() { tar czf "$out/details.tgz" -C "$work" details 2>/dev/null || true; }
limit() { timeout --kill-after=10 "$STEP_TIMEOUT" "$@"; }

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
# CRIU's own libraries (Debian 12's) are given to CRIU alone, through a wrapper, so
# that Python and PyTorch keep the machine's.
source "$root/scripts/device/carried-criu.sh"
use_carried_criu "$dev" "$work"
# The driver library, where the dynamic loader does not find it by itself.
if [ "${WORKLOAD}" != fake ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/local/cuda/compat; do
        if [ -e "$d/libcuda.so.1" ]; then
            export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            break
        fi
    done
fi
gpucr=$root/target/release/gpucr
cycle=$root/target/release/examples/checkpoint_cycle
ctl=$root/target/release/examples/cuda_ctl

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
    # Without persistence mode the driver rebuilds the GPU's state for the first client
    # after the last one closed: NVML's start in every restore may be that.
    note "persistence mode: $(nvidia-smi --query-gpu=persistence_mode --format=csv,noheader 2>&1 | head -1)"
else
    note "gpu: none found (no nvidia-smi)"
fi
note "cuda (driver): $(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1)"
note "pytorch: $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1)"
note "carried: $(paste -sd ',' "$dev/VERSIONS" | sed 's/,/, /g')"
# This machine's GPUs as gpucr's topology check sees them.
"$gpucr" check-topology > "$details/check-topology-machine.txt" 2>&1 ||
    note "check-topology of this machine failed: $(head -3 "$details/check-topology-machine.txt")"

# --- the workload ---------------------------------------------------------------------
if [ "$WORKLOAD" = fake ]; then
    export GPUCR_CUDA_LIBRARY=$root/target/release/libgpucr_fake_cuda.so
    export GPUCR_FAKE_CUDA_DIR=$work/fake GPUCR_FAKE_CUDA_GPUS=2
    mkdir -p "$GPUCR_FAKE_CUDA_DIR"
fi

# How workloads are started: in a PID namespace of their own (pidns: restored pids never
# collide), or as plain processes (plain: the restore needs their pids free again).
# auto: pidns where CUDA initialises inside a PID namespace, else plain; both tries
# are logged.
LAUNCH=${LAUNCH:-auto}
if [ "$LAUNCH" = auto ]; then
    if [ "$WORKLOAD" = fake ]; then
        LAUNCH=pidns
    else
        section "CUDA inside a PID namespace"
        probe='import torch; torch.zeros(1, device="cuda"); print("cuda initialised")'
        for how in "unshare --pid --fork" "unshare --pid --fork --mount-proc" ""; do
            echo "\$ $how python3 -c '$probe'"
            $how python3 -c "$probe" 2>&1 | tail -2
        done
        if unshare --pid --fork python3 -c "$probe" >/dev/null 2>&1; then LAUNCH=pidns; else LAUNCH=plain; fi
    fi
fi
note "workloads start as: $LAUNCH"

# Run COMMAND with no descriptor open but 0, 1 and 2 (for nsenter: it runs COMMAND).
without_fds() {
    local fd
    for fd in /proc/"$BASHPID"/fd/*; do
        fd=${fd##*/}
        [ "$fd" -gt 2 ] && eval "exec $fd>&-" 2>/dev/null
    done
    exec "$@"
}

# Start the workload with PROCS processes in its own PID namespace; prints the root's pid.
# WORKLOAD_NETNS names a network namespace (/run/netns) to start it in.
start_workload() {
    local state=$1 procs=$2 up pid="" ns=(unshare --pid --fork)
    [ "$LAUNCH" = plain ] && ns=()
    # With a mount namespace of its own, the job holds no descriptor of the script's,
    # and its standard ones are opened again inside: CRIU refuses a file on a mount the
    # tree's namespace does not have.
    [ "$LAUNCH" = pidns-proc ] && ns=(unshare --pid --fork --mount-proc
        sh -c 'exec "$@" </dev/null >/dev/null 2>&1' sh)
    [ -n "${WORKLOAD_NETNS:-}" ] && ns=(nsenter --net="/run/netns/$WORKLOAD_NETNS" "${ns[@]}")
    # (a function run with & is a subshell, which exec makes the command: $! stays its pid)
    [ "$LAUNCH" = pidns-proc ] && ns=(without_fds "${ns[@]}")
    rm -rf "$state"; mkdir -p "$state"
    if [ "$WORKLOAD" = fake ]; then
        "${ns[@]}" setsid "$root/target/release/examples/cuda_workload" \
            --state "$state" --procs "$procs" --mib 64 </dev/null >/dev/null 2>&1 &
    else
        "${ns[@]}" setsid python3 "$root/scripts/device/torch_tensors.py" \
            --state "$state" --gib "$TENSOR_GIB" --procs "$procs" </dev/null >/dev/null 2>&1 &
    fi
    up=$!
    for _ in $(seq 1800); do
        if [ "$LAUNCH" = plain ]; then
            pid=$up
        else
            pid=$(awk '{print $1}' "/proc/$up/task/$up/children" 2>/dev/null || true)
        fi
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

# Kill the tree rooted at PID and wait (up to 30 s) until its pids are free again: a
# plain restore needs the same pids.
kill_tree() {
    [ -n "${1:-}" ] || return 0
    # The root leads its session and process group (setsid); plain trees have no PID
    # namespace to take the children down with it.
    kill -KILL -- "-$1" 2>/dev/null
    kill -KILL "$1" 2>/dev/null
    for _ in $(seq 300); do
        [ -d "/proc/$1" ] || [ -n "$(pgrep -g "$1")" ] || break
        sleep 0.1
    done
    sleep 0.2
}

# --- 2. the driver path alone ---------------------------------------------------------
if wanted driver; then
section "driver path alone (no CRIU): lock, checkpoint, restore, unlock from another process"
state=$work/driver
if pid=$(start_workload "$state" 1); then
    note "driver path: 1 process, $TENSOR_GIB GiB of tensors"
    check_intact "$state" 1 || fail "checksums before the cycle"
    if limit "$cycle" "$pid" --repeat 1000 --hold-ms 1000 | tee "$details/driver-cycle.jsonl"; then
        if check_intact "$state" 2; then
            note "PASS driver path: $(grep -h summary "$details/driver-cycle.jsonl")"
            grep -hE '"(lock|checkpoint|restore|unlock|load\+cuInit)"' "$details/driver-cycle.jsonl" | tee -a "$summary"
        else
            fail "driver path: tensors differ after restore+unlock"
        fi
    else
        fail "driver path: checkpoint_cycle failed"
    fi
    # A fresh process for each call pays loading the driver and cuInit every time.
    fresh=$(date +%s%N)
    for _ in 1 2 3 4 5; do limit "$cycle" "$pid" --repeat 1 >> "$details/fresh-cycles.jsonl" 2>&1 || true; done
    note "fresh process per cycle (load + cuInit + the cycle's calls), mean of 5: $(( $(ms_since "$fresh") / 5 )) ms"
    grep -h 'load+cuInit' "$details/fresh-cycles.jsonl" | tee -a "$summary"
    check_intact "$state" 3 && note "PASS driver path: checksums match after 5 more cycles" || fail "driver path: checksums after the fresh cycles"
    kill_tree "$pid"
else
    fail "the workload did not start"
fi
save_details
fi

# --- 3. criu check ----------------------------------------------------------------------
if wanted criu; then
section "criu check"
criu --version 2>&1 | tee -a "$summary"
limit criu check 2>&1 | tail -15 | tee "$details/criu-check.txt"
note "criu check: $(tail -1 "$details/criu-check.txt")"
save_details
fi

# --- 4. end to end ----------------------------------------------------------------------
# Dump the tree of NAME (PROCS processes, GIB GiB each), kill it, restore it, compare the
# checksums; the image is removed afterwards. Sets dump_ms, restore_ms and ok (1 when
# every checksum matched); the manifest and the logs go to the details.
end_to_end() {
    local name=$1 procs=$2 gib=$3 state=$work/e2e-$1 img=$work/img-$1 pid t restored
    dump_ms="" restore_ms="" ok=0
    section "end to end: $name ($procs process(es), $gib GiB of tensors each)"
    pid=$(TENSOR_GIB=$gib start_workload "$state" "$procs") || { fail "$name: the workload did not start"; return; }
    check_intact "$state" 1 || fail "$name: checksums before the dump"
    rm -rf "$img"
    t=$(date +%s%N)
    if ! limit "$gpucr" dump "$pid" "$img" > "$details/dump-$name.txt" 2>&1; then
        cat "$details/dump-$name.txt"; tail -40 "$img/dump.log" 2>/dev/null
        cp "$img/dump.log" "$details/dump-$name.log" 2>/dev/null
        fail "$name: gpucr dump failed"; kill_tree "$pid"; rm -rf "$img"; return
    fi
    dump_ms=$(ms_since "$t")
    note "$name: gpucr dump $dump_ms ms, image $(du -sh "$img" | cut -f1), CRIU log $(wc -l < "$img/dump.log") lines"
    cp "$img/gpucr.json" "$details/manifest-$name.json" 2>/dev/null
    "$gpucr" inspect --all "$img" > "$details/inspect-$name.txt" 2>&1
    # Whether this machine can take the image back, and onto which GPUs (the NVIDIA
    # rules and the chosen UUID pairs).
    "$gpucr" check-topology "$img" > "$details/check-topology-$name.txt" 2>&1 ||
        fail "$name: check-topology of the image: $(head -3 "$details/check-topology-$name.txt")"
    kill_tree "$pid"
    t=$(date +%s%N)
    if ! restored=$(limit "$gpucr" restore --detach "$img" 2> "$details/restore-$name.txt"); then
        cat "$details/restore-$name.txt"; tail -40 "$img/restore.log" 2>/dev/null
        cp "$img/restore.log" "$details/restore-$name.log" 2>/dev/null
        fail "$name: gpucr restore failed"; rm -rf "$img"; return
    fi
    restore_ms=$(ms_since "$t")
    note "$name: gpucr restore $restore_ms ms (root pid $restored)"
    if check_intact "$state" 2; then
        ok=1; note "PASS $name: checksums match after restore"
    else
        fail "$name: checksums after restore"
    fi
    kill_tree "$restored"
    rm -rf "$img"
}

if wanted e2e; then
    end_to_end single 1 "$TENSOR_GIB"; save_details
    end_to_end tree 2 "$TENSOR_GIB"; save_details
fi

# The same by hand, as CRIU's own cuda route does it: the driver calls from another
# process (checkpoint_cycle), then plain `criu dump` / `criu restore` with no plugin.
# Sets dump_ms, restore_ms and ok as end_to_end does.
by_hand() {
    local name=$1 state=$work/$1 img=$work/img-$1 pid t criu_ms
    dump_ms="" restore_ms="" ok=0
    section "by hand ($name): lock+checkpoint, plain criu dump, kill, plain criu restore, restore+unlock"
    mkdir -p "$work/no-plugins"
    pid=$(start_workload "$state" 1) || { fail "$name: the workload did not start"; return; }
    check_intact "$state" 1 || fail "$name: checksums before the dump"
    rm -rf "$img" "$work/$name.pid"; mkdir -p "$img"
    t=$(date +%s%N)
    local driver_ms=""
    if limit "$cycle" "$pid" --steps checkpoint --repeat 1 >/dev/null && driver_ms=$(ms_since "$t") &&
        limit criu dump -t "$pid" -D "$img" -o dump.log --libdir "$work/no-plugins" >/dev/null 2>&1; then
        dump_ms=$(ms_since "$t")
        note "$name: lock+checkpoint+criu dump $dump_ms ms (driver calls $driver_ms ms), image $(du -sh "$img" | cut -f1)"
        kill_tree "$pid"
        t=$(date +%s%N)
        if limit criu restore -D "$img" -d -o restore.log --libdir "$work/no-plugins" \
                --pidfile "$work/$name.pid" >/dev/null 2>&1 &&
            criu_ms=$(ms_since "$t") &&
            limit "$cycle" "$(cat "$work/$name.pid")" --steps restore --repeat 1 >/dev/null; then
            restore_ms=$(ms_since "$t")
            note "$name: criu restore+restore+unlock $restore_ms ms (criu restore $criu_ms ms)"
            if check_intact "$state" 2; then ok=1; note "PASS $name: checksums match"; else fail "$name: checksums after restore"; fi
            kill_tree "$(cat "$work/$name.pid")"
        else
            cp "$img/restore.log" "$details/$name-restore.log" 2>/dev/null
            fail "$name: restore: $(grep Error "$img/restore.log" 2>/dev/null | tail -3)"
        fi
    else
        cp "$img/dump.log" "$details/$name-dump.log" 2>/dev/null
        fail "$name: dump: $(grep Error "$img/dump.log" 2>/dev/null | tail -3)"
        kill_tree "$pid"
    fi
    rm -rf "$img"
}

if wanted byhand; then
    by_hand byhand
    save_details
fi

# gpucr against the same driver calls by hand, ROUNDS rounds of one each, the order
# alternating from round to round; medians.
if wanted versus; then
    section "gpucr against by hand ($TENSOR_GIB GiB, $ROUNDS rounds, interleaved)"
    echo "# tool dump_ms restore_ms verified" > "$details/versus.txt"
    for round in $(seq "$ROUNDS"); do
        for tool in gpucr byhand; do
            [ $((round % 2)) = 0 ] && { [ $tool = gpucr ] && tool=byhand || tool=gpucr; }
            if [ $tool = gpucr ]; then
                end_to_end "versus-gpucr" 1 "$TENSOR_GIB"
                cp "$details/dump-versus-gpucr.txt" "$details/dump-versus-gpucr-$round.txt" 2>/dev/null
                cp "$details/restore-versus-gpucr.txt" "$details/restore-versus-gpucr-$round.txt" 2>/dev/null
            else
                by_hand "versus-byhand"
            fi
            echo "$tool ${dump_ms:-0} ${restore_ms:-0} $ok" | tee -a "$details/versus.txt"
        done
        save_details
    done
    python3 - "$details/versus.txt" <<'PY' | tee -a "$summary"
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
ok = [r for r in rows if r[3] == "1"]
def med(tool, col):
    v = [float(r[col]) for r in ok if r[0] == tool]
    return (statistics.median(v), min(v), max(v), len(v)) if v else (float("nan"),) * 3 + (0,)
for col, name in [(1, "dump (lock+checkpoint+CRIU)"), (2, "restore (CRIU+restore+unlock)")]:
    g, b = med("gpucr", col), med("byhand", col)
    print(f"versus: {name}: gpucr median {g[0]:.0f} ms ({g[1]:.0f}-{g[2]:.0f}, n={g[3]}), "
          f"by hand median {b[0]:.0f} ms ({b[1]:.0f}-{b[2]:.0f}, n={b[3]}), ratio {g[0] / b[0]:.3f}")
print(f"versus: {len(ok)} of {len(rows)} runs verified")
PY
fi

# --- failures and --leave-running on the real driver ----------------------------------
# TREE_GIB GiB: a dump with --leave-running (the job goes on, the image restores); dumps
# failed at each step of the cuda path (GPUCR_FAULT; a CUDA task has no device file, so
# dump-file and restore-file do not apply) leave the job running with its tensors
# intact; a restore failed after the driver's restore leaves no process, and the image
# then restores. (With WORKLOAD=fake the --leave-running image does not restore: the
# fake workload's journal file grows after the dump, and CRIU refuses a changed file.)
tree_gone() { [ -z "$(pgrep -f "torch_tensors.py --state $1" 2>/dev/null; pgrep -f "cuda_workload --state $1" 2>/dev/null)" ]; }
if wanted faults; then
    section "--leave-running and failures ($TREE_GIB GiB)"
    state=$work/leave img=$work/img-leave
    if pid=$(TENSOR_GIB=$TREE_GIB start_workload "$state" 1); then
        check_intact "$state" 1 || fail "leave-running: checksums before"
        t=$(date +%s%N)
        if limit "$gpucr" dump --leave-running "$pid" "$img" > "$details/dump-leave.txt" 2>&1; then
            note "leave-running: gpucr dump --leave-running $(ms_since "$t") ms"
            check_intact "$state" 2 && note "PASS leave-running: the job runs on, tensors intact" ||
                fail "leave-running: checksums after the dump"
            kill_tree "$pid"
            # The restored job is the job at the dump: it answers the second check again.
            rm -f "$state"/checksums-*-2
            if restored=$(limit "$gpucr" restore --detach "$img" 2> "$details/restore-leave.txt") &&
                check_intact "$state" 2; then
                note "PASS leave-running: its image restores, tensors intact"
            else
                fail "leave-running: restore of its image"; cat "$details/restore-leave.txt"
            fi
            kill_tree "${restored:-}"
        else
            fail "leave-running: gpucr dump failed: $(tail -3 "$details/dump-leave.txt")"
            kill_tree "$pid"
        fi
        rm -rf "$img"
    fi
    for step in plugin-pause pause plugin-checkpoint checkpoint; do
        state=$work/fault-$step img=$work/img-fault-$step
        pid=$(TENSOR_GIB=$TREE_GIB start_workload "$state" 1) || { fail "fault $step: the workload did not start"; continue; }
        check_intact "$state" 1 || fail "fault $step: checksums before"
        GPUCR_FAULT=$step limit "$gpucr" dump "$pid" "$img" > "$details/dump-fault-$step.txt" 2>&1
        rc=$?
        # Every injected fault is a device's failure: exit 11 (DEVICE_FAILED).
        if [ $rc = 0 ]; then
            fail "fault $step: the dump succeeded"
        elif [ $rc != 11 ]; then
            fail "fault $step: dump failed with exit $rc, not 11"
        elif check_intact "$state" 2; then
            note "PASS fault $step: dump failed (exit $rc), the job runs on, tensors intact"
        else
            fail "fault $step: dump failed (exit $rc) and the job is not intact"
        fi
        kill_tree "$pid"; rm -rf "$img"
        save_details
    done
    for step in resume plugin-resume; do
        state=$work/rfault-$step img=$work/img-rfault-$step
        pid=$(TENSOR_GIB=$TREE_GIB start_workload "$state" 1) || { fail "fault $step: the workload did not start"; continue; }
        check_intact "$state" 1 || fail "fault $step: checksums before"
        if ! limit "$gpucr" dump "$pid" "$img" > "$details/dump-rfault-$step.txt" 2>&1; then
            fail "fault $step: the dump failed"; kill_tree "$pid"; rm -rf "$img"; continue
        fi
        kill_tree "$pid"
        GPUCR_FAULT=$step limit "$gpucr" restore --detach "$img" > /dev/null 2> "$details/restore-rfault-$step.txt"
        rc=$?
        sleep 1
        if [ $rc = 0 ]; then
            fail "fault $step: the restore succeeded"
        elif [ $rc != 11 ]; then
            fail "fault $step: restore failed with exit $rc, not 11"
            pkill -KILL -f "torch_tensors.py --state $state"
        elif tree_gone "$state"; then
            note "PASS fault $step: restore failed (exit $rc), no process left"
        else
            fail "fault $step: restore failed (exit $rc) but a process is left: $(pgrep -f "torch_tensors.py --state $state")"
            pkill -KILL -f "torch_tensors.py --state $state"
        fi
        # The image is still whole: a second restore without the fault succeeds.
        if restored=$(limit "$gpucr" restore --detach "$img" 2>> "$details/restore-rfault-$step.txt") &&
            check_intact "$state" 2; then
            note "PASS fault $step: the image then restores, tensors intact"
        else
            fail "fault $step: the restore after the failed one"
        fi
        kill_tree "${restored:-}"; rm -rf "$img"
        save_details
    done
fi

# --- gpucr killed outright: the guards -------------------------------------------------
# The driver's state of PID as cuda_ctl reads it (running, locked, checkpointed, ...), or
# "none" when the call fails.
cuda_state() { "$ctl" state "$1" 2>/dev/null || echo none; }

# TREE_GIB GiB, one process. A `gpucr dump` killed with SIGKILL once the driver reports
# the process locked or checkpointed: its CUDA guard gives the process back (running,
# tensors intact) and says so in the image's gpucr-incomplete.json. A `gpucr restore`
# killed while the driver restores the process: its restore guard leaves no process,
# and the image then restores.
if wanted guard; then
    section "gpucr killed (SIGKILL) during a dump and during a restore ($TREE_GIB GiB)"
    state=$work/guard img=$work/img-guard
    # The fake driver takes a second a step, so that the kill lands between two.
    [ "$WORKLOAD" = fake ] && export GPUCR_FAKE_CUDA_STEP_MS=1000
    if pid=$(TENSOR_GIB=$TREE_GIB start_workload "$state" 1); then
        check_intact "$state" 1 || fail "guard: checksums before"
        rm -rf "$img"
        "$gpucr" dump "$pid" "$img" > "$details/dump-guard.txt" 2>&1 &
        dumper=$!
        seen=running
        for _ in $(seq 3000); do
            seen=$(cuda_state "$pid")
            case $seen in locked|checkpointed) break ;; esac
            kill -0 "$dumper" 2>/dev/null || break
            sleep 0.01
        done
        if kill -KILL "$dumper" 2>/dev/null; then
            wait "$dumper" 2>/dev/null
            note "guard: gpucr dump killed with the process $seen"
            for _ in $(seq 600); do
                grep -q "guard gave the processes back" "$img/gpucr-incomplete.json" 2>/dev/null && break
                sleep 0.1
            done
            cp "$img/gpucr-incomplete.json" "$details/guard-incomplete.json" 2>/dev/null
            after=$(cuda_state "$pid")
            if grep -q "guard gave the processes back" "$img/gpucr-incomplete.json" 2>/dev/null &&
                [ "$after" = running ] && check_intact "$state" 2; then
                note "PASS guard (dump): the guard gave the process back (running), tensors intact"
            else
                fail "guard (dump): state $after; $(head -c 400 "$img/gpucr-incomplete.json" 2>/dev/null)"
            fi
        else
            wait "$dumper"
            fail "guard (dump): the dump ended before the process was seen locked (last state $seen)"
        fi
        kill_tree "$pid"; rm -rf "$img"
    else
        fail "guard: the workload did not start"
    fi
    save_details
    state=$work/rguard img=$work/img-rguard
    if pid=$(TENSOR_GIB=$TREE_GIB start_workload "$state" 1); then
        check_intact "$state" 1 || fail "guard (restore): checksums before"
        rm -rf "$img"
        if limit "$gpucr" dump "$pid" "$img" > "$details/dump-rguard.txt" 2>&1; then
            kill_tree "$pid"
            "$gpucr" restore --detach "$img" > /dev/null 2> "$details/restore-rguard.txt" &
            restorer=$!
            seen=none
            for _ in $(seq 3000); do
                for p in $(pgrep -f "torch_tensors.py --state $state"; pgrep -f "cuda_workload --state $state"); do
                    seen=$(cuda_state "$p")
                    [ "$seen" = checkpointed ] && break 2
                done
                kill -0 "$restorer" 2>/dev/null || break
                sleep 0.01
            done
            if [ "$seen" = checkpointed ] && kill -KILL "$restorer" 2>/dev/null; then
                wait "$restorer" 2>/dev/null
                for _ in $(seq 300); do tree_gone "$state" && break; sleep 0.1; done
                if tree_gone "$state"; then
                    note "PASS guard (restore): gpucr restore killed with the process checkpointed, no process left"
                else
                    fail "guard (restore): a process is left: $(pgrep -f -- "--state $state" | tr '\n' ' ')"
                    pkill -KILL -f -- "--state $state"
                fi
                [ "$WORKLOAD" = fake ] && unset GPUCR_FAKE_CUDA_STEP_MS
                if restored=$(limit "$gpucr" restore --detach "$img" 2>> "$details/restore-rguard.txt") &&
                    check_intact "$state" 2; then
                    note "PASS guard (restore): the image then restores, tensors intact"
                elif [ "$WORKLOAD" = fake ]; then
                    # The fake keeps the killed restore's request in its files (tests/cuda.rs).
                    note "guard (restore): the second restore is not checked on the fake driver"
                else
                    fail "guard (restore): the restore after the killed one"
                fi
                kill_tree "${restored:-}"
            else
                wait "$restorer"
                note "guard (restore): not caught: the restore ended before the process was seen checkpointed (last state $seen)"
                pkill -KILL -f -- "--state $state"
            fi
        else
            fail "guard (restore): the dump failed: $(tail -3 "$details/dump-rguard.txt")"
            kill_tree "$pid"
        fi
        rm -rf "$img"
    fi
    unset GPUCR_FAKE_CUDA_STEP_MS
    save_details
fi

# --- engine mode: CRIU run by hand, as runc runs it -----------------------------------
# The plugin installed into a directory of its own, the workload (TREE_GIB GiB, one
# process) in a freezer cgroup of its own, `criu dump --freeze-cgroup --libdir`: the
# whole tree locked at the root's PAUSE_DEVICES, the GPU memory in the image before CRIU
# dumps the first task's memory, gpucr named in the image; then `criu restore --libdir`
# with the helper started by the plugin, tensors checked after.
if wanted engine; then
    section "engine mode: CRIU run by hand with the installed plugin ($TREE_GIB GiB)"
    libs=$work/criu-libs state=$work/engine img=$work/img-engine
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        cg=/sys/fs/cgroup/gpucr-validate-$$
    else
        cg=/sys/fs/cgroup/freezer/gpucr-validate-$$
    fi
    settings=()
    [ "$WORKLOAD" = fake ] && settings=(--setting "GPUCR_CUDA_LIBRARY=$GPUCR_CUDA_LIBRARY")
    if ! "$gpucr" install-plugin --criu-libdir "$libs" "${settings[@]}" > "$details/install-plugin.txt" 2>&1; then
        fail "engine: install-plugin: $(tail -3 "$details/install-plugin.txt")"
    elif ! mkdir -p "$cg"; then
        fail "engine: cannot make the cgroup $cg"
    elif pid=$(TENSOR_GIB=$TREE_GIB start_workload "$state" 1); then
        check_intact "$state" 1 || fail "engine: checksums before"
        for p in $pid $(pgrep -P "$pid"); do echo "$p" > "$cg/cgroup.procs"; done
        rm -rf "$img"; mkdir -p "$img"
        t=$(date +%s%N)
        if limit criu dump -t "$pid" -D "$img" -o dump.log -v4 --libdir "$libs" \
                --freeze-cgroup "$cg" > "$details/engine-dump.txt" 2>&1; then
            note "engine: criu dump $(ms_since "$t") ms, image $(du -sh "$img" | cut -f1)"
            cp "$img/dump.log" "$details/engine-dump.log"
            in_image=$(grep -n "engine mode: GPU memory is in the image" "$img/dump.log" | head -1 | cut -d: -f1)
            first_pages=$(grep -n "Dumping pages" "$img/dump.log" | head -1 | cut -d: -f1)
            if [ -n "$in_image" ] && [ -n "$first_pages" ] && [ "$in_image" -lt "$first_pages" ]; then
                note "PASS engine: GPU memory in the image (log line $in_image) before CRIU dumps memory (line $first_pages)"
            else
                fail "engine: 'GPU memory is in the image' at log line ${in_image:-none}, first pages at ${first_pages:-none}"
            fi
            [ -f "$img/gpucr.json" ] && note "PASS engine: the image has gpucr's manifest" ||
                fail "engine: no gpucr.json in the image"
            "$gpucr" inspect --all "$img" > "$details/inspect-engine.txt" 2>&1
            kill_tree "$pid"
            t=$(date +%s%N)
            if limit criu restore -D "$img" -d -o restore.log -v4 --libdir "$libs" \
                    --pidfile "$work/engine.pid" > "$details/engine-restore.txt" 2>&1; then
                note "engine: criu restore $(ms_since "$t") ms"
                if check_intact "$state" 2; then
                    note "PASS engine: restored by CRIU with the plugin, tensors intact"
                else
                    fail "engine: checksums after the restore"
                fi
                kill_tree "$(cat "$work/engine.pid")"
            else
                cp "$img/restore.log" "$details/engine-restore.log" 2>/dev/null
                fail "engine: criu restore: $(grep -E 'Error|gpucr: error' "$img/restore.log" 2>/dev/null | tail -3)"
                pkill -KILL -f -- "--state $state"
            fi
        else
            cp "$img/dump.log" "$details/engine-dump.log" 2>/dev/null
            fail "engine: criu dump: $(grep -E 'Error|gpucr: error' "$img/dump.log" 2>/dev/null | tail -3)"
            kill_tree "$pid"
        fi
        rm -rf "$img"
    else
        fail "engine: the workload did not start"
    fi
    rmdir "$cg" 2>/dev/null
    save_details
fi

# --- 5. a 4-process tree against one process ----------------------------------------
# The lock and checkpoint wall times come from the manifest's operation log: from the
# first task's "pause" (lock) start to the last one's end, and the same for
# "checkpoint".
lock_checkpoint_walls() {
    python3 - "$1" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
tasks = m["gpu"]["tasks"]
def wall(name):
    ops = [o for t in tasks for o in t["operations"] if o["name"] == name]
    if not ops:
        return 0.0
    return max(o["start_ms"] + o["duration_ms"] for o in ops) - min(o["start_ms"] for o in ops)
lock, ckpt = wall("pause"), wall("checkpoint")
print(f"{len(tasks)} {lock:.1f} {ckpt:.1f} {lock + ckpt:.1f}")
PY
}

if wanted tree4; then
    section "4-process tree against one process ($TREE_GIB GiB each, $ROUNDS rounds)"
    echo "# procs lock_ms checkpoint_ms lock+checkpoint_ms dump_ms restore_ms verified" > "$details/tree4.txt"
    for round in $(seq "$ROUNDS"); do
        for procs in 1 4; do
            # alternate the order from round to round
            [ $((round % 2)) = 0 ] && procs=$((5 - procs))
            end_to_end "tree4-$procs" "$procs" "$TREE_GIB"
            [ -n "$dump_ms" ] || continue
            walls=$(lock_checkpoint_walls "$details/manifest-tree4-$procs.json")
            echo "$procs ${walls#* } $dump_ms ${restore_ms:-0} $ok" | tee -a "$details/tree4.txt"
        done
        save_details
    done
    python3 - "$details/tree4.txt" <<'PY' | tee -a "$summary"
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
def med(procs, col):
    v = [float(r[col]) for r in rows if r[0] == procs]
    return statistics.median(v) if v else float("nan")
for col, name in [(3, "lock+checkpoint wall"), (1, "lock wall"), (2, "checkpoint wall"), (4, "gpucr dump"), (5, "gpucr restore")]:
    one, four = med("1", col), med("4", col)
    print(f"tree4: {name}: 1 process {one:.0f} ms, 4 processes {four:.0f} ms, ratio {four / one:.2f}")
bad = [r for r in rows if r[6] != "1"]
print(f"tree4: {len(rows)} dumps, {len(rows) - len(bad)} restores verified")
PY
fi

# --- 6. on-demand restore ---------------------------------------------------------------
# One restore of IMG in MODE (plain, fill: --lazy with the staged memory brought in
# before the driver's restore, lazy: --lazy leaving it to the driver's reads), the tree
# killed after its checksums are compared (K numbers the round's logs). Appends a row
# to lazy.txt.
lazy_round() {
    local mode=$1 img=$2 state=$3 k=$4 t restored ms resume all fault ok=0 err=$details/restore-lazy-$1-$4.txt
    local args=(restore --detach) env=()
    [ "$mode" = plain ] || args+=(--lazy)
    [ "$mode" = lazy ] && env=(GPUCR_LAZY_STAGING=lazy)
    t=$(date +%s%N)
    if restored=$(env "${env[@]}" timeout --kill-after=10 "$STEP_TIMEOUT" "$gpucr" "${args[@]}" "$img" 2> "$err"); then
        ms=$(ms_since "$t")
        # Time to resume: the timeline's spans up to CRIU's end. Detached, a --lazy
        # restore returns once the tree runs and its helper writes "all memory in at N
        # ms" (on the restore's clock) to the image's lazy-pages.log when done.
        resume=$(awk '/-> criu-done/ {s += $1; print s; exit} / ms  .* -> / {s += $1}' "$err")
        all=- fault=-
        if [ "$mode" != plain ]; then
            for _ in $(seq $((STEP_TIMEOUT * 10))); do
                grep -q 'all memory in\|lazy-pages server failed\|error' "$img/lazy-pages.log" 2>/dev/null && break
                sleep 0.1
            done
            cp "$img/lazy-pages.log" "$details/lazy-pages-$mode-$k.log" 2>/dev/null || true
            all=$(sed -n 's/.*all memory in at \([0-9.]*\) ms.*/\1ms/p' "$img/lazy-pages.log" 2>/dev/null | head -1)
            fault=$(sed -n 's/.*pages (\([^)]*\)) on fault.*/\1/p' "$img/lazy-pages.log" 2>/dev/null | head -1 | tr -d ' ')
        fi
        # Every round restores the process as the dump found it, having answered one
        # request (check_intact "$state" 1 before the dump): its next answer is the 2nd.
        check_intact "$state" 2 && ok=1
        echo "$mode $ms ${resume:--} ${all:--} ${fault:--} $ok" | tee -a "$details/lazy.txt"
        kill_tree "$restored"
    else
        echo "$mode failed - - - 0" | tee -a "$details/lazy.txt"
        cp "$img/restore.log" "$details/restore-lazy-$mode-$k.log" 2>/dev/null
        tail -5 "$err"
        fail "lazy: $mode restore (round $k): $(grep -m1 'error' "$err")"
    fi
}

if wanted lazy; then
    section "on-demand restore (--lazy) of 1 process, $TENSOR_GIB GiB of tensors, $ROUNDS rounds"
    state=$work/lazy img=$work/img-lazy
    if pid=$(start_workload "$state" 1); then
        check_intact "$state" 1 || fail "lazy: checksums before the dump"
        rm -rf "$img"
        if limit "$gpucr" dump "$pid" "$img" > "$details/dump-lazy.txt" 2>&1; then
            kill_tree "$pid"
            # Every round restores the same image: the files the tree holds open (the
            # fake workload's journals grow) go back to what the dump saw each time.
            rm -rf "$state.at-dump"; cp -a "$state" "$state.at-dump"
            echo "# mode restore_ms resume_ms all_memory_in fault_bytes verified" > "$details/lazy.txt"
            k=2
            for round in $(seq "$ROUNDS"); do
                for mode in plain fill lazy; do
                    rm -rf "$state"; cp -a "$state.at-dump" "$state"
                    lazy_round "$mode" "$img" "$state" "$k"; k=$((k + 1))
                done
                save_details
            done
            python3 - "$details/lazy.txt" <<'PY' | tee -a "$summary"
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
for mode in ("plain", "fill", "lazy"):
    mine = [r for r in rows if r[0] == mode]
    done = [r for r in mine if r[1] != "failed"]
    med = lambda col: statistics.median(float(r[col]) for r in done) if done else float("nan")
    resume = [float(r[2]) for r in done if r[2] != "-"]
    print(f"lazy: {mode}: {len(done)}/{len(mine)} restored, {sum(r[5] == '1' for r in mine)} verified; "
          f"restore (until all memory in) median {med(1):.0f} ms; time to resume median "
          f"{statistics.median(resume) if resume else float('nan'):.0f} ms; all memory in "
          f"{[r[3] for r in done]}; on fault {[r[4] for r in done]}")
lazy = [r for r in rows if r[0] == "lazy"]
copes = lazy and all(r[1] != "failed" and r[5] == "1" for r in lazy)
print("lazy: the driver " + ("copes" if copes else "does NOT cope") +
      " with staged memory registered with a userfaultfd (GPUCR_LAZY_STAGING=lazy: "
      f"{sum(r[5] == '1' for r in lazy)}/{len(lazy)} restores verified; the bytes on fault "
      "say how much of it the driver's reads faulted in)")
PY
        else
            cat "$details/dump-lazy.txt"; fail "lazy: gpucr dump failed"; kill_tree "$pid"
        fi
        rm -rf "$img" "$state.at-dump"
    else
        fail "lazy: the workload did not start"
    fi
    save_details
fi

# --- 7. live migration ---------------------------------------------------------------
# `gpucr migrate` of the 1-process workload (TENSOR_GIB) between two network namespaces
# of this machine joined by a veth pair, once stop-and-copy and once --post-copy: the
# receiver restores it while the source's stopped copy still holds its pids, so the job
# runs in a PID namespace of its own, with its own /proc (CUDA does not start in one
# that shares the host's). Checksums compared on the destination; frozen_ms,
# downtime_ms (post-copy), sent_ms and the bytes streamed while CRIU dumped recorded.
# MIGRATE_LAUNCH (pidns-proc; pidns for WORKLOAD=fake) says how the job starts.
if wanted migrate; then
    section "live migration of 1 process ($TENSOR_GIB GiB of tensors) between two network namespaces"
    src=gpucr-validate-src dst=gpucr-validate-dst keys=$work/keys
    for n in $src $dst; do ip netns del "$n" 2>/dev/null; ip netns add "$n"; ip -n "$n" link set lo up; done
    ip -n "$src" link add eth0 type veth peer name eth0 netns "$dst"
    ip -n "$src" addr add 10.203.0.1/24 dev eth0 && ip -n "$dst" addr add 10.203.0.2/24 dev eth0
    ip -n "$src" link set eth0 up && ip -n "$dst" link set eth0 up
    mkdir -p "$keys" && (cd "$keys" && "$gpucr" keygen src >/dev/null && "$gpucr" keygen dst >/dev/null)
    saved_launch=$LAUNCH
    if [ "$WORKLOAD" = fake ]; then LAUNCH=${MIGRATE_LAUNCH:-pidns}; else LAUNCH=${MIGRATE_LAUNCH:-pidns-proc}; fi
    note "migrate: the job starts as $LAUNCH"
    for mode in stop-and-copy post-copy; do
        state=$work/migrate-$mode received=$work/received-$mode
        if ! pid=$(WORKLOAD_NETNS=$src start_workload "$state" 1); then
            fail "migrate $mode: the workload did not start ($LAUNCH)"
            continue
        fi
        check_intact "$state" 1 || fail "migrate $mode: checksums before the move"
        mkdir -p "$received"
        nsenter --net="/run/netns/$dst" timeout --kill-after=10 "$STEP_TIMEOUT" "$gpucr" receive \
            --once --listen 10.203.0.2:7431 --dir "$received" --key "$keys/dst.key" \
            --cert "$keys/dst.crt" --peer-cert "$keys/src.crt" \
            > "$details/receive-$mode.out" 2> "$details/receive-$mode.err" &
        receiver=$!
        sleep 1
        flags=(); [ "$mode" = post-copy ] && flags=(--post-copy)
        t=$(date +%s%N)
        nsenter --net="/run/netns/$src" timeout --kill-after=10 "$STEP_TIMEOUT" "$gpucr" migrate \
            --json "${flags[@]}" "$pid" 10.203.0.2 --key "$keys/src.key" \
            --cert "$keys/src.crt" --peer-cert "$keys/dst.crt" \
            > "$details/migrate-$mode.json" 2> "$details/migrate-$mode.err"
        rc=$? ms=$(ms_since "$t")
        wait "$receiver"; receiver_rc=$?
        restored=$(head -1 "$details/receive-$mode.out" 2>/dev/null)
        if [ "$rc" = 0 ] && [ "$receiver_rc" = 0 ] && check_intact "$state" 2; then
            note "PASS migrate $mode in $ms ms: $(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(", ".join(f"{k} {j.get(k)}" for k in ("frozen_ms","downtime_ms","sent_ms","bytes","streamed_bytes")))' "$details/migrate-$mode.json")"
        else
            fail "migrate $mode: gpucr migrate exit $rc, receive exit $receiver_rc: $(grep -h 'error' "$details/migrate-$mode.err" "$details/receive-$mode.err" | head -2 | tr '\n' ' ')"
        fi
        kill_tree "$restored"; kill_tree "$pid"
        cp "$received"/*/gpucr.json "$details/manifest-migrate-$mode.json" 2>/dev/null
        rm -rf "$received" "$state"
    done
    LAUNCH=$saved_launch
    for n in $src $dst; do ip netns del "$n" 2>/dev/null; done
    save_details
fi

# --- 8. benchmarks on this machine's cores --------------------------------------------
if [ "$RUNS" -gt 0 ] && wanted parallel; then
    section "parallel restore benchmark ($(nproc) cores, RUNS=$RUNS)"
    RUNS=$RUNS STEP_TIMEOUT=$BENCH_TIMEOUT limit scripts/bench-parallel-restore.sh > "$details/bench-parallel-restore.txt" 2>&1 ||
        fail "bench-parallel-restore.sh"
    tail -40 "$details/bench-parallel-restore.txt"
    save_details
fi
if [ "$RUNS" -gt 0 ] && wanted cpu; then
    section "CPU-only dump/restore against plain CRIU ($(nproc) cores, RUNS=$RUNS)"
    RUNS=$RUNS STEP_TIMEOUT=$BENCH_TIMEOUT limit scripts/bench-dump-restore.sh > "$details/bench-dump-restore.txt" 2>&1 ||
        fail "bench-dump-restore.sh"
    tail -30 "$details/bench-dump-restore.txt"
    save_details
fi

section "summary"
cat "$summary"
save_details
rm -rf "$work"
