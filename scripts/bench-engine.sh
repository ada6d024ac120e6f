#!/usr/bin/env bash
# Benchmark engine mode: a container holding N MiB of simulated GPU memory checkpointed
# by podman (runc's CRIU with gpucr's plugin, which starts gpucr's helper itself) against
# the same workload outside a container checkpointed by `gpucr dump`, side by side in one
# run, interleaved.
#
#   scripts/bench-engine.sh [--mib N] [--runs N] [--fill mixed|random] [--keep]
#
# Each run, in turn (both trees live on, so the same workloads serve every run; the
# first two alternate their order; each starts with an empty image directory and no
# dirty pages, both prepared outside the measured time):
#   engine  podman container checkpoint --keep --leave-running CTR (image, log kept)
#   gpucr   gpucr dump --leave-running PID DIR
#   podman  podman container checkpoint --keep --leave-running PLAIN (a container without
#           GPU, one sleeping process: what podman, conmon, runc and CRIU's handling of a
#           container cost by themselves, for reference; a shell loop forking `sleep`
#           would make CRIU's cgroup-v1 freeze retry after 100 ms in some runs)
#   bare    the same checkpoint of a second such container whose CRIU loads no plugin
#           (no org.criu.config annotation): what having gpucr's plugin installed
#           costs a container that holds no GPU
#   engine0, gpucr0  the same two checkpoints of the same workload holding 1 MiB of GPU
#           memory instead of N MiB, in a container of its own and outside one (the
#           simulator's workload always opens its device, so "without GPU" is without
#           GPU memory); the four GPU checkpoints run in an order reversed every run
#
# The target (docs/benchmarks.md, "Engine mode"): what the plugin adds to podman's
# checkpoint of the same container without GPU is at most 1.1 times what `gpucr dump`'s
# GPU work costs for the same memory: (engine - engine0) <= 1.1 x (gpucr - gpucr0).
# GPU memory is compressed with zstd (level 1) in both modes; --fill is the workload's
# (mixed, the default: random, compressible and zeroed buffers; random: all random). Prints a Markdown section
# for docs/benchmarks.md on stdout (medians, engine/gpucr, and the target's ratio), then
# a line `ROW|Engine mode|target|result|PASS or FAIL` (scripts/bench-all.sh collects it);
# progress on stderr.
# Needs root, CRIU, podman and runc (scripts/setup.sh).
set -euo pipefail
# The measured commands run in a session of their own (scripts/bench-session.sh).
# shellcheck source=bench-session.sh source-path=SCRIPTDIR
source "$(dirname "$0")/bench-session.sh"
bench_session_start "$@"
bench_session_nice
cd "$(dirname "$0")/.."

mib=1024
runs=9
fill=mixed
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --mib) mib=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --fill) fill=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        *) echo "usage: $0 [--mib N] [--runs N] [--fill mixed|random] [--keep]" >&2; exit 2 ;;
    esac
done

log() { printf 'bench-engine: %s\n' "$*" >&2; }
for tool in criu podman python3; do
    command -v "$tool" >/dev/null || { log "error: $tool is not installed"; exit 1; }
done

work=$(mktemp -d /var/tmp/gpucr-bench-engine.XXXXXX)
sim_ctr=/dev/shm/gpucr-bench-engine-ctr-$$
sim_host=/dev/shm/gpucr-bench-engine-host-$$
sim_ctr0=/dev/shm/gpucr-bench-engine-ctr0-$$
sim_host0=/dev/shm/gpucr-bench-engine-host0-$$
ctr=gpucr-bench-engine-$$
ctr0=gpucr-bench-engine0-$$
plain=gpucr-bench-plain-$$
bare=gpucr-bench-bare-$$
image=localhost/gpucr-bench-engine:latest
unshare_pid=
host_pid=
unshare_pid0=
host_pid0=
cleanup() {
    podman rm -f -t 0 "$ctr" "$ctr0" "$plain" "$bare" >/dev/null 2>&1 || true
    # The workloads first: each is its PID namespace's init, which outlives `unshare`.
    local pid
    for pid in "$host_pid" "$unshare_pid" "$host_pid0" "$unshare_pid0"; do
        if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null || true; fi
    done
    rm -rf "$sim_ctr" "$sim_host" "$sim_ctr0" "$sim_host0"
    if [ "$keep" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

log "building gpucr (release) and the simulator's workload"
cargo build --release -q --workspace --bins --examples --lib
target=${CARGO_TARGET_DIR:-$PWD/target}/release
gpucr=$target/gpucr

log "making the container image (the workload, /bin/sh, sleep and their libraries)"
root=$work/root
mkdir -p "$root"/{bin,tmp,proc,sys,dev,etc,state}
for bin in /bin/sh /bin/sleep "$target/examples/sim_workload"; do
    for f in "$bin" $(ldd "$bin" | grep -o '/[^ ]*'); do
        mkdir -p "$root/$(dirname "$f")"
        cp -L "$f" "$root/$f"
    done
done
cp "$target/examples/sim_workload" "$root/bin/sim_workload"
tar -C "$root" -cf "$work/rootfs.tar" .
podman import -q "$work/rootfs.tar" "$image" >/dev/null

ulimits=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
# The simulator's roots first: install-plugin checks that GPUCR_SIM_ROOT is a directory.
mkdir -p "$sim_ctr" "$sim_host" "$sim_ctr0" "$sim_host0" "$work/state-ctr" "$work/state-host" \
    "$work/state-ctr0" "$work/state-host0" "$work/state-plain"
log "installing the plugin for engine mode into $work/criu-libs"
"$gpucr" install-plugin --criu-libdir "$work/criu-libs" --setting "GPUCR_SIM_ROOT=$sim_ctr" >/dev/null
printf 'libdir %s\n' "$work/criu-libs" >"$work/criu.conf"
# The container with 1 MiB of GPU memory has a simulator root of its own (both
# containers' workloads are PID 1 in their namespaces), so a plugin set up for it.
"$gpucr" install-plugin --criu-libdir "$work/criu-libs0" --setting "GPUCR_SIM_ROOT=$sim_ctr0" >/dev/null
printf 'libdir %s\n' "$work/criu-libs0" >"$work/criu0.conf"

log "starting the container with $mib MiB of GPU memory"
podman run -d --name "$ctr" --annotation "org.criu.config=$work/criu.conf" "${ulimits[@]}" \
    --device /dev/fuse -v "$work/state-ctr:/state" -v "$sim_ctr:$sim_ctr" -e "GPUCR_SIM_ROOT=$sim_ctr" \
    "$image" /bin/sim_workload --state /state --gpus 1 --parent-mib "$mib" --child-mib 0 --fill "$fill" >/dev/null
podman run -d --name "$ctr0" --annotation "org.criu.config=$work/criu0.conf" "${ulimits[@]}" \
    --device /dev/fuse -v "$work/state-ctr0:/state" -v "$sim_ctr0:$sim_ctr0" -e "GPUCR_SIM_ROOT=$sim_ctr0" \
    "$image" /bin/sim_workload --state /state --gpus 1 --parent-mib 1 --child-mib 0 --fill "$fill" >/dev/null
podman run -d --name "$plain" --annotation "org.criu.config=$work/criu.conf" "${ulimits[@]}" \
    -v "$work/state-plain:/state" "$image" /bin/sleep 1000000 >/dev/null
podman run -d --name "$bare" "${ulimits[@]}" \
    -v "$work/state-plain:/state" "$image" /bin/sleep 1000000 >/dev/null
log "starting the same workload outside a container"
GPUCR_SIM_ROOT=$sim_host unshare --pid --fork --kill-child setsid "$target/examples/sim_workload" \
    --state "$work/state-host" --gpus 1 --parent-mib "$mib" --child-mib 0 --fill "$fill" </dev/null >"$work/workload.log" 2>&1 &
unshare_pid=$!
GPUCR_SIM_ROOT=$sim_host0 unshare --pid --fork --kill-child setsid "$target/examples/sim_workload" \
    --state "$work/state-host0" --gpus 1 --parent-mib 1 --child-mib 0 --fill "$fill" </dev/null >"$work/workload0.log" 2>&1 &
unshare_pid0=$!
for state in state-ctr state-host state-ctr0 state-host0; do
    for _ in $(seq 1200); do [ -e "$work/$state/ready-parent" ] && break; sleep 0.1; done
    [ -e "$work/$state/ready-parent" ] || { log "error: the workload in $state did not start"; exit 1; }
done
host_pid=$(tr -d ' \n' <"/proc/$unshare_pid/task/$unshare_pid/children")
host_pid0=$(tr -d ' \n' <"/proc/$unshare_pid0/task/$unshare_pid0/children")
userdata() { echo "/var/lib/containers/storage/overlay-containers/$(podman inspect --format '{{.Id}}' "$1")/userdata"; }
ctr_images=$(userdata "$ctr")/checkpoint
ctr0_images=$(userdata "$ctr0")/checkpoint
plain_images=$(userdata "$plain")/checkpoint
bare_images=$(userdata "$bare")/checkpoint

time_one() { # label command...
    local start end
    # Each checkpoint starts alike: every earlier image removed (removing gigabytes of
    # files is not the checkpoint's cost; with an earlier image still in the page cache,
    # whichever checkpoint came second in a run took up to 0.9 s longer at 3 GiB) and
    # no dirty pages left whose writeback would slow this one.
    rm -rf "$ctr_images" "$ctr0_images" "$work/img" "$plain_images" "$bare_images"
    sync
    start=$(date +%s.%N)
    "${@:2}" >/dev/null 2>"$work/last.err" || { log "error: $1 failed"; cat "$work/last.err" >&2; exit 1; }
    end=$(date +%s.%N)
    echo "$1 $(python3 -c "print(f'{$end - $start:.4f}')")" >>"$work/times"
}

: >"$work/times"
load_before=$(cut -d' ' -f1 /proc/loadavg)
log "$runs runs after one warm-up, interleaved"
for run in $(seq 0 "$runs"); do
    # The order of the four GPU checkpoints is reversed from run to run.
    if [ $((run % 2)) = 0 ]; then
        time_one engine podman container checkpoint --keep --leave-running "$ctr"
        time_one gpucr env GPUCR_SIM_ROOT="$sim_host" "$gpucr" dump --leave-running "$host_pid" "$work/img"
        time_one engine0 podman container checkpoint --keep --leave-running "$ctr0"
        time_one gpucr0 env GPUCR_SIM_ROOT="$sim_host0" "$gpucr" dump --leave-running "$host_pid0" "$work/img"
    else
        time_one gpucr0 env GPUCR_SIM_ROOT="$sim_host0" "$gpucr" dump --leave-running "$host_pid0" "$work/img"
        time_one engine0 podman container checkpoint --keep --leave-running "$ctr0"
        time_one gpucr env GPUCR_SIM_ROOT="$sim_host" "$gpucr" dump --leave-running "$host_pid" "$work/img"
        time_one engine podman container checkpoint --keep --leave-running "$ctr"
    fi
    time_one podman podman container checkpoint --keep --leave-running "$plain"
    time_one bare podman container checkpoint --keep --leave-running "$bare"
    [ "$run" = 0 ] && : >"$work/times"   # the warm-up run is not counted
    log "run $run done"
done
load_after=$(cut -d' ' -f1 /proc/loadavg)
grep -q 'gpucr: engine mode: GPU memory is in the image' "$(userdata "$ctr")/dump.log" \
    || { log "error: the container was not checkpointed in engine mode"; exit 1; }
cp "$(userdata "$ctr")/dump.log" "$work/engine-dump.log"   # CRIU's log of the last engine-mode run

python3 - "$work/times" "$mib" "$runs" "$load_before" "$load_after" "$(git rev-parse --short HEAD)" "$fill" "$work/engine-dump.log" <<'EOF'
import re, statistics, sys, platform, subprocess
path, mib, runs, before, after, commit, fill, criu_log = sys.argv[1:]
times = {}
for line in open(path):
    label, value = line.split()
    times.setdefault(label, []).append(float(value))
med = {k: statistics.median(v) for k, v in times.items()}
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '?')
print(f"### Engine mode vs `gpucr dump` ({mib} MiB of simulated GPU memory, fill {fill})\n")
print(f"Command: `scripts/bench-engine.sh --mib {mib} --runs {runs} --fill {fill}` (commit `{commit}`), "
      f"{subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores ({cpu}), "
      f"kernel {platform.release()}, podman + runc (Debian 12), CRIU 4.2.1, release build; "
      f"{runs} interleaved runs after one warm-up; load average {before} before, {after} after.\n")
print("| checkpoint | median s | min s | max s |")
print("|---|---|---|---|")
for label, what in [("engine", "podman checkpoint, GPU container (engine mode)"),
                    ("gpucr", "`gpucr dump`, same workload, no container"),
                    ("engine0", "podman checkpoint, the same container with 1 MiB of GPU memory"),
                    ("gpucr0", "`gpucr dump`, the same workload with 1 MiB of GPU memory"),
                    ("podman", "podman checkpoint, container without GPU"),
                    ("bare", "the same, its CRIU loading no plugin")]:
    v = times[label]
    print(f"| {what} | {med[label]:.3f} | {min(v):.3f} | {max(v):.3f} |")
print()
print(f"engine / gpucr: **{med['engine'] / med['gpucr']:.3f}**; "
      f"(engine - podman's own cost) / gpucr: **{(med['engine'] - med['podman']) / med['gpucr']:.3f}**; "
      f"container without GPU, plugin installed / no plugin: **{med['podman'] / med['bare']:.3f}**")
# The target: what the plugin adds to podman's checkpoint of the same container without
# GPU memory, against what `gpucr dump`'s GPU work costs for the same memory.
adds, work = med["engine"] - med["engine0"], med["gpucr"] - med["gpucr0"]
ratio = adds / work if work > 0 else float("nan")
verdict = "PASS" if ratio <= 1.1 else "FAIL" if ratio > 1.1 else "-"
print()
print(f"what the plugin adds to podman's checkpoint (GPU container - the one with 1 MiB): {adds:.3f} s; "
      f"what `gpucr dump`'s GPU work costs (`gpucr dump` - the same with 1 MiB): {work:.3f} s; "
      f"ratio **{ratio:.3f}** (target <= 1.1: "
      f"{ {'PASS': 'met', 'FAIL': 'not met'}.get(verdict, 'cannot tell') })")

# Where the last engine-mode checkpoint's time went, from CRIU's own log (seconds since
# CRIU started): the first line matching each mark.
marks = [("helper started", "gpucr: engine mode: helper ready"),
         ("tree frozen, copy started", "gpucr: CHECKPOINT_DEVICES pid"),
         ("first device file: waiting for the copy", "device carried by gpucr"),
         ("copy finished", "gpucr: engine mode: GPU memory is in the image"),
         ("post-dump: exit hook (devices back, checksums, manifest)", "Running network-unlock scripts"),
         ("exit hook done", "gpucr: engine mode: DumpDone done"),
         ("CRIU finished", "Dumping finished successfully")]
at = {}
for line in open(criu_log, errors="replace"):
    m = re.match(r"\((\d+\.\d+)\) (.*)", line)
    if not m:
        continue
    for name, needle in marks:
        if name not in at and needle in m.group(2):
            at[name] = float(m.group(1))
print()
print("The last engine-mode checkpoint in CRIU's log (s since CRIU started): " +
      "; ".join(f"{name} {at[name]:.3f}" for name, _ in marks if name in at))
print()
print(f"ROW|Engine mode|(podman with GPU - without) <= 1.1 x (gpucr dump with GPU - without)|"
      f"{ratio:.3f} (podman +{adds:.3f} s, gpucr dump +{work:.3f} s; {mib} MiB, fill {fill})|{verdict}")
EOF
