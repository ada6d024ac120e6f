#!/usr/bin/env bash
# gpucr's main job on the bundled sample workloads, from a fresh machine:
# set everything up; then a CPU process tree and a GPU process tree (on the simulator,
# which stands in for the driver on a machine without GPUs), each started in its own PID
# namespace, dumped (which kills it), inspected, restored, and shown to carry on where
# it was: the GPU tree's every byte of device memory verified after the restore.
#
#   scripts/demo.sh [--memory-mib N]      (as root; default 256)
set -euo pipefail
trap 'printf "demo: failed (exit status %s): %s\n" "$?" "$BASH_COMMAND" >&2' ERR
cd "$(dirname "$0")/.."

memory_mib=256
if [ "${1:-}" = "--memory-mib" ]; then memory_mib=${2:?}; fi

scripts/setup.sh

gpucr=target/release/gpucr
workload=target/release/examples/workload
work=$(mktemp -d /tmp/gpucr-demo.XXXXXX)
state=$work/state
image=$work/image
mkdir -p "$state"
sim_workload=target/release/examples/sim_workload
sim_root=/dev/shm/gpucr-demo-sim.$$
restored=""
unshare_pid=""
sim_pids=()
cleanup() {
    [ -n "$restored" ] && kill -KILL "$restored" 2>/dev/null || true
    [ -n "$unshare_pid" ] && kill -KILL "$unshare_pid" 2>/dev/null || true
    [ -n "${root:-}" ] && kill -KILL "$root" 2>/dev/null || true
    for p in "${sim_pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    rm -rf "$sim_root" "$work"
}
trap cleanup EXIT

say() { printf '\n== %s\n' "$*"; }
last_ticks() {
    for role in parent tcp pipe; do
        printf '   %-7s %s\n' "$role" "$(tail -n 1 "$state/journal-$role")"
    done
}

say "starting the sample workload ($memory_mib MiB pattern, 3 processes, pipe, socketpair, TCP, memfd)"
unshare --pid --fork setsid "$workload" --state "$state" --memory-mib "$memory_mib" \
    </dev/null >/dev/null 2>&1 &
unshare_pid=$!
for _ in $(seq 200); do
    root=$(cat "/proc/$unshare_pid/task/$unshare_pid/children" 2>/dev/null | awk '{print $1}')
    [ -n "$root" ] && [ -f "$state/ready" ] && break
    sleep 0.1
done
[ -f "$state/ready" ] || { echo "the workload did not start" >&2; exit 1; }
sleep 1
echo "   root pid $root"
last_ticks

say "gpucr dump --tcp-established $root $image"
"$gpucr" dump --tcp-established "$root" "$image"
for _ in $(seq 100); do [ -d "/proc/$root" ] || break; sleep 0.1; done
if [ -d "/proc/$root" ]; then echo "   the tree is still there?" >&2; else echo "   the tree is gone (dump kills it)"; fi
before=$(tail -n 1 "$state/journal-parent" | sed 's/ .*//')

if "$gpucr" inspect --help >/dev/null 2>&1 && "$gpucr" inspect "$image" >/dev/null 2>&1; then
    say "gpucr inspect $image"
    "$gpucr" inspect --ps-tree-cmd "$image" || true
fi

say "gpucr restore --detach $image"
restored=$("$gpucr" restore --detach "$image")
echo "   restored root pid $restored"
sleep 2
last_ticks
after=$(tail -n 1 "$state/journal-parent" | sed 's/ .*//')

say "result"
lines=$(wc -l < "$state/journal-parent")
if awk -F'[ =]' '{ if ($2 != NR) bad=1; if ($0 ~ /BAD/) bad=1 } END { exit bad }' "$state/journal-parent"; then
    echo "   journal-parent: $lines consecutive ticks, $before at the dump, $after now; every check ok"
    echo "   the restored tree carried on from where it was"
else
    echo "   journal-parent is broken: the restore lost something" >&2
    exit 1
fi
kill -KILL "$restored" 2>/dev/null || true

# ---- the GPU path, on the simulator -------------------------------------------------
# Two simulated GPUs (a KFD-format topology and device memory as files on tmpfs that
# CRIU does not dump, as it does not dump VRAM); a parent and a child process, each with
# buffers of its own on both GPUs, and kernel threads rewriting them.
sim_state=$work/sim-state
sim_image=$work/sim-image
mkdir -p "$sim_state"
export GPUCR_SIM_ROOT=$sim_root

# field ROLE NAME: the NAME= value of the last line of ROLE's journal.
field() { tail -n 1 "$sim_state/journal-$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
# verify N: ask both processes to check every byte of their buffers; true when all match.
verify() {
    echo "$1" >"$sim_state/verify"
    for _ in $(seq 600); do
        local done=1
        for role in parent child; do
            [ "$(field $role bad)" = 0 ] || return 1
            [ "$(field $role verified)" -ge "$1" ] || done=0
        done
        [ "$done" = 1 ] && return 0
        sleep 0.1
    done
    return 1
}
sim_ticks() {
    for role in parent child; do
        printf '   %-7s %s\n' "$role" "$(tail -n 1 "$sim_state/journal-$role")"
    done
}

say "starting the simulated GPU workload (2 GPUs; parent 256 MiB and child 128 MiB of buffers, 128 MiB of CPU memory each)"
unshare --pid --fork setsid "$sim_workload" --state "$sim_state" --gpus 2 \
    --parent-mib 256 --child-mib 128 --cpu-mib 128 </dev/null >/dev/null 2>&1 &
sim_unshare=$!
sim_pids+=("$sim_unshare")
sim_root_pid=""
for _ in $(seq 600); do
    sim_root_pid=$(cat "/proc/$sim_unshare/task/$sim_unshare/children" 2>/dev/null | awk '{print $1}')
    [ -n "$sim_root_pid" ] && [ -f "$sim_state/ready-parent" ] && [ -f "$sim_state/ready-child" ] \
        && [ -s "$sim_state/journal-child" ] && break
    sleep 0.1
done
[ -f "$sim_state/ready-child" ] || { echo "the simulated GPU workload did not start" >&2; exit 1; }
sim_pids+=("$sim_root_pid")
verify 1 || { echo "the buffers do not verify before the dump" >&2; exit 1; }
echo "   root pid $sim_root_pid; every buffer checked before the dump"
sim_ticks
steps_before=$(( $(field parent steps) + $(field child steps) ))

say "gpucr dump $sim_root_pid $sim_image"
"$gpucr" dump "$sim_root_pid" "$sim_image"
for _ in $(seq 100); do [ -d "/proc/$sim_root_pid" ] || break; sleep 0.1; done
steps_dumped=$(( $(field parent steps) + $(field child steps) ))

say "gpucr inspect --gpu $sim_image"
"$gpucr" inspect --gpu "$sim_image"

say "wiping the simulated device memory (rm -rf \$GPUCR_SIM_ROOT/contexts), as on a new machine"
rm -rf "$sim_root/contexts"

say "gpucr restore --detach $sim_image"
restored=$("$gpucr" restore --detach "$sim_image")
sim_pids+=("$restored")
echo "   restored root pid $restored"

say "result"
if ! verify 2; then
    echo "   the restored GPU memory does not verify:" >&2
    sim_ticks >&2
    cat "$sim_state"/bad-* >&2 2>/dev/null || true
    exit 1
fi
sleep 0.5
sim_ticks
steps_after=$(( $(field parent steps) + $(field child steps) ))
if [ "$steps_after" -le "$steps_dumped" ]; then
    echo "   the kernels did not go on after the restore ($steps_dumped steps at the dump, $steps_after now)" >&2
    exit 1
fi
echo "   kernel steps: $steps_before before the dump, $steps_dumped at the dump, $steps_after now"
echo "   simulated GPU memory verified after restore: every byte of 384 MiB in 2 processes on 2 GPUs"
