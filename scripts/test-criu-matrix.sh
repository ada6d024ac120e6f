#!/usr/bin/env bash
# Run the tests that checkpoint with CRIU against one of the other CRIU versions gpucr is
# tested with, built side by side (scripts/install-criu.sh --version VERSION, into
# /opt/gpucr/criu/VERSION/bin/criu; built first when it is not there yet).
#
#   scripts/test-criu-matrix.sh VERSION        (as root; VERSION: 4.1.1, 4.2.1, dev-2cf8f13)
#
# Environment: CRIU_TARBALL=PATH, that version's pinned tarball (see install-criu.sh), used
# when the version must be built; CRIU_MATRIX_PREFIX=DIR builds and runs DIR/bin/criu
# instead of /opt/gpucr/criu/VERSION/bin/criu.
#
# Every test below runs the chosen CRIU, wherever it starts CRIU from:
#   * gpucr (dump, restore) runs GPUCR_CRIU, set to the chosen binary;
#   * everything that runs `criu` by name takes it from PATH, whose first directory here
#     holds only a `criu` that logs its run and executes the chosen binary: the tests that
#     run CRIU themselves (engine mode without an engine), podman's own CRIU check, runc
#     at `podman container checkpoint` (podman runs it with podman's PATH) and runc at
#     `podman container restore` (run by conmon, which podman 4.3 hands its PATH too).
#     The run checks the log: the tests of tests/containers.rs must have had CRIU run by
#     runc under podman and by runc under conmon through it, and those of tests/gpu.rs
#     and tests/cuda.rs by the test itself. tests/real_programs.rs (PostgreSQL, nginx, a
#     Python multiprocessing pool, from Debian's packages) runs them through gpucr.
# tests/amdgpu.rs (the amdgpu backend against the fake kernel) is not run: it calls the
# plugin's hook functions in-process and never starts CRIU, so no CRIU version reaches it.
# Then abi/tests/criu_binary_abi.rs checks that the plugin tells this CRIU's hook ABI
# right, and with criu-dev the simulator's round trip runs ROUND_TRIPS times in a row
# (default 20).
#
# The tests are picked by exact name; each must run and pass (a renamed test fails the
# run instead of silently leaving the list; GPUCR_TESTS_MAY_SKIP is ignored). Tests whose workload holds a TCP socket
# are not run with CRIU 4.1.1, which cannot dump TCP or UDP sockets on Linux >= 6.16
# (CRIU issue #2705); each is named when it is left out. Exits 0 when every test run
# passed, 1 otherwise; prints the wall time of each test binary and of the whole run.
set -euo pipefail
trap 'printf "test-criu-matrix: failed (exit status %s): %s\n" "$?" "$BASH_COMMAND" >&2' ERR
cd "$(dirname "$0")/.."

log() { printf 'test-criu-matrix: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 2; }

[ "$#" -eq 1 ] || die "usage: scripts/test-criu-matrix.sh VERSION (4.1.1, 4.2.1 or dev-2cf8f13)"
version=$1
case $version in
    4.1.1|4.2.1|dev-2cf8f13) ;;
    *) die "unknown CRIU version '$version' (known: 4.1.1, 4.2.1, dev-2cf8f13)" ;;
esac
[ "$(id -u)" = 0 ] || die "run as root (CRIU and the tests need it)"

# The subset, as "test-binary test-name", one comment each.
tests=(
    # the simulator, KFD driver model: a parent and child with device memory dumped,
    # the device wiped, restored, every byte checked
    "gpu sim_tree_survives_dump_wipe_and_restore"
    # the simulator, NVIDIA driver model (device state bound to the task, let run at
    # RESUME_DEVICES_LATE)
    "gpu nvidia_model_tree_survives_dump_wipe_and_restore"
    # both models with a zombie in the tree (CRIU restores it; the plugin skips it)
    "gpu kfd_model_tree_with_a_zombie_survives_dump_wipe_and_restore"
    "gpu nvidia_model_tree_with_a_zombie_survives_dump_wipe_and_restore"
    # --leave-running, then the same image restored twice
    "gpu leave_running_then_restore_twice"
    # NVIDIA model, --leave-running: the job goes on with its device memory
    "gpu nvidia_model_leave_running_keeps_the_job_going"
    # KFD model, a stopped process dumped and restored stopped
    "gpu kfd_model_stopped_process_is_dumped_and_restored_stopped"
    # a GPU process in its own mount namespace (CRIU restores the mounts first)
    "gpu gpu_process_with_its_own_mount_namespace_restores"
    # a file bind-mounted in the namespace the tree's own was copied from: CRIU 4.1 dumps
    # it but cannot restore it, so gpucr refuses the dump first; later CRIU restores it
    "gpu a_file_mount_older_criu_cannot_restore_is_refused_before_the_dump"
    # a damaged device chunk: the plugin fails the restore and CRIU leaves no process
    "gpu bad_gpu_chunk_aborts_the_restore_cleanly"
    # a fault injected at every dump and restore step of the KFD and NVIDIA models
    "gpu kfd_model_fault_at_every_step_loses_nothing"
    "gpu nvidia_model_fault_at_every_step_loses_nothing"
    # engine mode without an engine: `criu dump` with the plugin, its log in the image
    "gpu engine_mode_with_criu_logging_into_the_image_directory"
    # CRIU without the plugin refuses the device (the plugin is what carries it)
    "gpu plain_criu_cannot_dump_the_device"
    # the fake CUDA driver: a tree locked, checkpointed, dumped, wiped and restored
    "cuda cuda_tree_survives_dump_wipe_and_restore"
    # the same with a zombie in the tree
    "cuda cuda_tree_with_a_zombie_survives_dump_wipe_and_restore"
    # CUDA, --leave-running: the job gets its GPU back and goes on
    "cuda cuda_leave_running_keeps_the_job_going"
    # CUDA with the device memory kept in gpucr's own storage instead of the driver's
    "cuda cuda_custom_storage_tree_survives_dump_wipe_and_restore"
    # a SIGKILL to gpucr during a CUDA restore leaves no process
    "cuda sigkill_during_a_cuda_restore_leaves_no_process"
    # engine mode without an engine, CUDA: `criu dump` with the plugin on a full disk
    "cuda engine_mode_cuda_tree_without_room_fails_the_dump_and_runs_on"
    # podman: a container without devices, the plugin installed, checkpointed and restored
    "containers plain_container_round_trip_with_the_plugin_installed"
    # podman, engine mode: the simulator's GPU workload checkpointed and restored by runc's CRIU
    "containers gpu_container_round_trip_in_engine_mode"
    # podman, engine mode, the fake CUDA driver
    "containers cuda_container_round_trip_in_engine_mode"
    # podman, engine mode, --leave-running
    "containers gpu_container_leave_running"
    # podman, engine mode: a damaged chunk fails the restore and no container is left running
    "containers gpu_container_restore_fails_cleanly_on_a_bad_chunk"
    # the CPU sample tree (TCP, unix socket, pipe, memfd, threads): dump, kill, restore
    "checkpoint dump_kill_restore_continues_where_it_was"
    # the CPU sample tree, --leave-running
    "checkpoint leave_running_keeps_the_tree_running"
    # the CPU sample tree, one image restored twice
    "checkpoint one_image_restores_twice"
    # the CPU sample tree's exit status handed on by a waiting restore
    "checkpoint restore_waits_for_the_tree_and_exits_with_its_status"
    # real programs (Debian's): a Python multiprocessing pool with shared memory, mid-task
    # (no sockets: the CPU round trip CRIU 4.1 can do here)
    "real_programs python_multiprocessing_pool_finishes_its_tasks_after_restore"
    # nginx holding a keep-alive connection
    "real_programs nginx_serves_a_keep_alive_connection_across_dump_and_restore"
    # PostgreSQL with a client inside an open transaction
    "real_programs postgres_transaction_goes_on_after_restore"
    # post-copy migration of a Python program without sockets: CRIU sends its pages to
    # gpucr's page server, whose header CRIU 4.2 widened
    "migrate post_copy_moves_a_python_program_whose_memory_never_touches_the_source_disk"
)
# Tests whose workload holds TCP sockets (examples/workload.rs, the CPU sample tree;
# nginx's and PostgreSQL's connections).
tcp_tests=(
    dump_kill_restore_continues_where_it_was
    leave_running_keeps_the_tree_running
    one_image_restores_twice
    restore_waits_for_the_tree_and_exits_with_its_status
    nginx_serves_a_keep_alive_connection_across_dump_and_restore
    postgres_transaction_goes_on_after_restore
)

start=$(date +%s)
prefix=${CRIU_MATRIX_PREFIX:-/opt/gpucr/criu/$version}
scripts/install-criu.sh --version "$version" --prefix "$prefix"
criu=$prefix/bin/criu
[ -x "$criu" ] || die "$criu was not built"

work=$(mktemp -d /tmp/gpucr-criu-matrix.XXXXXX)
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
mkdir "$work/bin"
runs=$work/criu-runs.log
: >"$runs"
# One line a run: the program that ran it, that program's parent, CRIU's arguments.
cat >"$work/bin/criu" <<WRAPPER
#!/bin/sh
parent=\$(cat /proc/\$PPID/comm 2>/dev/null)
grandparent=\$(awk '/^PPid:/ { print \$2 }' /proc/\$PPID/status 2>/dev/null)
grandparent=\$(cat /proc/\$grandparent/comm 2>/dev/null)
echo "\$parent \$grandparent \$*" >>"$runs"
exec "$criu" "\$@"
WRAPPER
chmod 0755 "$work/bin/criu"
export GPUCR_CRIU=$criu
# Every test of the matrix must run: a requirement the machine lacks (podman, root) fails
# it here, whatever GPUCR_TESTS_MAY_SKIP says for the main suite.
unset GPUCR_TESTS_MAY_SKIP
export PATH=$work/bin:$PATH
[ "$(command -v criu)" = "$work/bin/criu" ] || die "criu on PATH is $(command -v criu), not $work/bin/criu"

log "CRIU $version: $criu ($("$criu" --version | sed -n 's/^Version: *//p'))"
log "building gpucr, its plugin and the workloads"
cargo build --workspace --all-features --lib --bins --examples -q

summary=()
failed=0
for bin in gpu cuda containers checkpoint real_programs migrate; do
    names=()
    for t in "${tests[@]}"; do
        [ "${t%% *}" = "$bin" ] || continue
        name=${t#* }
        if [ "$version" = 4.1.1 ] && printf '%s\n' "${tcp_tests[@]}" | grep -qx "$name"; then
            echo "not run with CRIU 4.1.1: $name: CRIU 4.1 cannot dump TCP sockets on Linux >= 6.16"
            continue
        fi
        names+=("$name")
    done
    [ "${#names[@]}" -gt 0 ] || continue
    log "tests/$bin.rs: ${#names[@]} tests with CRIU $version"
    t0=$(date +%s)
    out=$work/$bin.out
    rc=0
    cargo test --all-features --test "$bin" -- --exact "${names[@]}" 2>&1 | tee "$out" || rc=$?
    secs=$(( $(date +%s) - t0 ))
    # The CRIU runs through PATH during this binary's tests, and who made them.
    lines=$(wc -l <"$runs")
    new_runs=$(tail -n +"$(( ${seen_runs:-0} + 1 ))" "$runs")
    seen_runs=$lines
    case $bin in
        containers) wanted_runs=("runc podman" "runc conmon") ;;
        gpu|cuda) wanted_runs=("$bin-") ;;
        *) wanted_runs=() ;;
    esac
    for who in "${wanted_runs[@]}"; do
        if ! grep -q "^$who" <<<"$new_runs"; then
            failed=1
            summary+=("tests/$bin.rs: no CRIU run by '$who' went through $work/bin/criu: the chosen CRIU was not used")
        fi
    done
    if [ -n "$new_runs" ]; then
        log "tests/$bin.rs: $(wc -l <<<"$new_runs") CRIU runs through PATH ($(cut -d' ' -f1,2 <<<"$new_runs" | sort | uniq -c | awk '{ printf "%s%s by %s under %s", sep, $1, $2, $3; sep = ", " }'))"
    else
        log "tests/$bin.rs: no CRIU runs through PATH (gpucr ran GPUCR_CRIU)"
    fi
    missing=()
    for name in "${names[@]}"; do
        grep -Eq "^test $name \.\.\. ok$" "$out" || missing+=("$name")
    done
    if [ "$rc" -ne 0 ] || [ "${#missing[@]}" -gt 0 ]; then
        failed=1
        summary+=("tests/$bin.rs: FAILED in ${secs}s (cargo test exit status $rc); not passed: ${missing[*]:-none named}")
    else
        summary+=("tests/$bin.rs: ${#names[@]} passed in ${secs}s")
    fi
done

# The hook ABI the plugin tells from this CRIU's binary is the one its header declares
# (criu-dev calls itself 4.2, so the ABI is named here, not read from its version).
case $version in
    4.1.1) abi=4.1 ;;
    4.2.1) abi=4.2 ;;
    dev-2cf8f13) abi=4.3 ;;
esac
t0=$(date +%s)
if GPUCR_CRIU_ABI=$abi cargo test -p gpucr-abi --test criu_binary_abi 2>&1 | tee "$work/abi.out" \
        && grep -q "^test the_criu_binary_is_detected_as_its_header_declares ... ok$" "$work/abi.out"; then
    summary+=("abi/tests/criu_binary_abi.rs: detected as CRIU $abi's hook ABI ($(( $(date +%s) - t0 ))s)")
else
    failed=1
    summary+=("abi/tests/criu_binary_abi.rs: FAILED: $criu not detected as CRIU $abi's hook ABI")
fi

# criu-dev reads RESTORE_EXT_FILE's retry_needed from its own stack unless the plugin
# writes it, so one passing restore can be luck: the simulator's round trip runs
# ROUND_TRIPS times in a row (default 20) with it.
if [ "$version" = dev-2cf8f13 ]; then
    rounds=${ROUND_TRIPS:-20}
    t0=$(date +%s)
    passed=0
    for round in $(seq "$rounds"); do
        out=$work/round-$round.out
        if cargo test --all-features --test gpu -- --exact sim_tree_survives_dump_wipe_and_restore \
                >"$out" 2>&1 && grep -q "^test sim_tree_survives_dump_wipe_and_restore ... ok$" "$out"; then
            passed=$((passed + 1))
        else
            cat "$out"
            log "round trip $round of $rounds FAILED"
            break
        fi
    done
    if [ "$passed" = "$rounds" ]; then
        summary+=("tests/gpu.rs: the simulator's round trip passed $rounds times in a row in $(( $(date +%s) - t0 ))s")
    else
        failed=1
        summary+=("tests/gpu.rs: the simulator's round trip passed $passed times, then failed (of $rounds)")
    fi
fi

total=$(( $(date +%s) - start ))
for line in "${summary[@]}"; do log "$line"; done
if [ "$failed" = 0 ]; then
    log "CRIU $version: every test passed (${total}s in all)"
else
    log "CRIU $version: FAILED (${total}s in all)"
fi
exit "$failed"
