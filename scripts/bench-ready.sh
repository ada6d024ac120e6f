#!/usr/bin/env bash
# Benchmark: time to ready. A server holding MEM_MIB of memory (examples/serve_memory.rs)
# is dumped once by gpucr; then RUNS interleaved rounds restore that one image each way
# below, with the page cache warm and dropped, and time, from the start of the restore:
#   * the first answer: a client connects (retrying while the port is closed) and asks
#     for the hot set, which the server checks against its pattern;
#   * all memory back: for `gpucr restore` its end (it returns once every page is in);
#     for `gpucr restore --lazy --detach` (which returns once the tree runs) the moment
#     its helper writes "all memory in" to lazy-pages.log; for CRIU's own lazy restore
#     the end of its `criu lazy-pages` daemon, which exits once every page is transferred.
# Each round ends with the restored server asked to check every page ("all"), which must
# answer "ok". Results: docs/benchmarks.md ("Time to ready").
#
# Then the same for the simulator's GPU tree (examples/sim_workload, options SIM_TREE;
# SIM_TREE="" skips it): a parent and children each holding device buffers and CPU
# memory, copy engines at GPUCR_SIM_COPY_BW. Before each restore its device memory is
# wiped (a new machine). "First answer": the parent's journal grows (a line every 100
# ms, so up to 100 ms late); all memory back as above; each round ends with every
# process checking every byte of its buffers and CPU memory.
#
#   scripts/bench-ready.sh                  (SIZES="1024 4096" RUNS=3 CACHES="warm cold")
#
# MODES: `restore` (gpucr restore --detach), `lazy` (gpucr restore --lazy --detach) and
# `criu-lazy` (criu restore --lazy-pages with criu lazy-pages on the same image; for
# the GPU tree its failure is printed as the row, CRIU alone restoring no GPU state).
# HOT_MIB (default 8): the hot set.
set -euo pipefail
# shellcheck source=bench-session.sh source-path=SCRIPTDIR
source "$(dirname "$0")/bench-session.sh"
# shellcheck source=bench-serve-memory.sh source-path=SCRIPTDIR
source "$(dirname "$0")/bench-serve-memory.sh"
# shellcheck source=bench-sim-tree.sh source-path=SCRIPTDIR
source "$(dirname "$0")/bench-sim-tree.sh"
bench_session_start "$@"
bench_session_nice
cd "$(dirname "$0")/.."
root=$PWD
SIZES=${SIZES:-1024 4096}
RUNS=${RUNS:-3}
CACHES=${CACHES:-warm cold}
MODES=${MODES:-restore lazy criu-lazy}
HOT_MIB=${HOT_MIB:-8}
WORK=${WORK:-/var/tmp/gpucr-bench-ready}
SIM_TREE=${SIM_TREE---gpus 2 --children 2 --parent-mib 256 --child-mib 128 --cpu-mib 512 --fill random}
export GPUCR_SIM_ROOT=${GPUCR_SIM_ROOT:-/dev/shm/gpucr-bench-ready-sim}
export GPUCR_SIM_COPY_BW=${GPUCR_SIM_COPY_BW:-1.6GB/s}
gpucr=$root/target/release/gpucr
server=$root/target/release/examples/serve_memory
workload=$root/target/release/examples/sim_workload
criu=$(command -v criu)

{ [ -x "$gpucr" ] && [ -x "$server" ] && [ -x "$workload" ]; } ||
    cargo build --release --workspace --lib --bins --examples -q
rm -rf "$WORK" && mkdir -p "$WORK"
ms() { echo $(( $(date +%s%N) / 1000000 )); }

# The client: connect (retrying while nothing listens), send each request, print the
# replies and the milliseconds since the epoch when the first reply came.
ask() {
    python3 "$serve_memory_client" "$(cat "$WORK/state/address")" 120 "$@"
}

# Wait until file $1 has a line containing $2 (a line containing $3 fails); print the
# milliseconds since the epoch when it was seen (the file looked at every 2 ms).
wait_line() {
    python3 - "$@" <<'PY'
import os, sys, time
path, want, failed = sys.argv[1:4]
deadline, size = time.time() + 300, -1
while time.time() < deadline:
    try:
        now = os.stat(path).st_size
    except FileNotFoundError:
        now = -1
    if now != size:
        size = now
        text = open(path).read() if now >= 0 else ""
        if want in text:
            print(int(time.time() * 1000))
            sys.exit(0)
        if failed in text:
            sys.exit(text)
    time.sleep(0.002)
sys.exit("no %r in %s" % (want, path))
PY
}

kill_tree() {
    kill_pidfiles "$WORK"/pid "$WORK"/restored
}

start_server() {
    local mib=$1 pid
    rm -rf "$WORK/state" && mkdir -p "$WORK/state"
    unshare --pid --fork setsid "$server" --state "$WORK/state" --memory-mib "$mib" \
        --hot-mib "$HOT_MIB" </dev/null >/dev/null 2>&1 &
    pid=$(tree_root_when_ready $! "$WORK/state/ready" "the server")
    echo "$pid" > "$WORK/pid"
}

# The simulator's GPU tree, started with options $SIM_TREE in a sim root of its own;
# its state directory as at the dump is kept for each restore.
start_sim_tree() {
    start_sim_tree_through 2 "$workload"
}

# Before each restore of the GPU tree: its files as at the dump, no device memory.
prepare_sim_tree() {
    rm -rf "$WORK/state" && cp -a "$WORK/state-at-dump" "$WORK/state"
    rm -rf "$GPUCR_SIM_ROOT/contexts"
}

# Print the milliseconds since the epoch when file $1 grew past $2 bytes.
wait_growth() {
    python3 - "$@" <<'PY'
import os, sys, time
path, size = sys.argv[1], int(sys.argv[2])
deadline = time.time() + 300
while time.time() < deadline:
    if os.stat(path).st_size > size:
        print(int(time.time() * 1000))
        sys.exit(0)
    time.sleep(0.002)
sys.exit("%s did not grow" % path)
PY
}

# Ask every process of the GPU tree to check every byte; fail unless all say so.
verify_sim_tree() {
    local n; n=$(date +%s)
    echo "$n" > "$WORK/state/verify"
    python3 - "$WORK/state" "$n" <<'PY'
import glob, sys, time
state, n = sys.argv[1], int(sys.argv[2])
deadline = time.time() + 300
while time.time() < deadline:
    last = {}
    for path in glob.glob(state + "/journal-*"):
        # The last whole line (one may be half written).
        line = open(path).read().rsplit("\n", 2)[-2]
        last[path] = dict(f.split("=") for f in line.split())
    if any(f["bad"] != "0" for f in last.values()):
        sys.exit("bad: %s" % last)
    if last and all(int(f["verified"]) >= n for f in last.values()):
        sys.exit(0)
    time.sleep(0.1)
sys.exit("not verified: %s" % last)
PY
}

# One restore of $WORK/image of workload $1 (server or sim) in mode $2 with the page
# cache $3; prints "mode cache first_ms all_ms", or for a restore that cannot be done
# "mode cache - - why".
restore_once() {
    local kind=$1 mode=$2 cache=$3 t0 first all reply lazy restoring grown=0
    rm -rf "$WORK/run" && mkdir -p "$WORK/run"
    if [ "$kind" = sim ]; then
        prepare_sim_tree
        grown=$(stat -c %s "$WORK/state/journal-parent")
    fi
    [ "$cache" = cold ] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
    case $mode in
    restore|lazy)
        rm -f "$WORK/image/lazy-pages.log"
        local lazy_flag=()
        [ "$mode" = lazy ] && lazy_flag=(--lazy)
        t0=$(ms)
        "$gpucr" restore "${lazy_flag[@]}" --detach "$WORK/image" > "$WORK/restored" \
            2> "$WORK/run/err" &
        restoring=$! ;;
    criu-lazy)
        "$criu" lazy-pages -D "$WORK/image" -W "$WORK/run" -o lazy.log &
        lazy=$!
        for _ in $(seq 200); do [ -S "$WORK/run/lazy-pages.socket" ] && break; sleep 0.01; done
        t0=$(ms)
        "$criu" restore -D "$WORK/image" -W "$WORK/run" --lazy-pages -d -o restore.log \
            --pidfile "$WORK/restored" &
        restoring=$! ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    if [ "$kind" = sim ] && [ "$mode" = criu-lazy ] && ! wait "$restoring"; then
        kill "$lazy" 2>/dev/null; wait "$lazy" 2>/dev/null || true
        # CRIU's first error that is not about its own rlimit (logged on every restore here).
        echo "$mode $cache - - $(grep 'Error' "$WORK/run/restore.log" | grep -v rlimit |
            head -1 | sed 's/^ *[0-9]*: //' | cut -c1-160)"
        return
    fi
    if [ "$kind" = sim ]; then
        first=$(wait_growth "$WORK/state/journal-parent" "$grown")
    else
        reply=$(ask hot)
        grep -q '^hot ok' <<<"$reply" || { echo "$mode: hot set answered: $reply" >&2; exit 1; }
        first=$(sed -n 's/^first //p' <<<"$reply")
    fi
    first=$(( first - t0 ))
    case $mode in
    restore)
        wait "$restoring" || { cat "$WORK/run/err" >&2; exit 1; }
        all=$(ms) ;;
    lazy)
        wait "$restoring" || { cat "$WORK/run/err" >&2; exit 1; }
        all=$(wait_line "$WORK/image/lazy-pages.log" "all memory in" "failed") ;;
    criu-lazy)
        wait "$restoring" || { tail -5 "$WORK/run/restore.log" >&2; exit 1; }
        wait "$lazy" || { tail -5 "$WORK/run/lazy.log" >&2; exit 1; }
        all=$(ms) ;;
    esac
    all=$(( all - t0 ))
    if [ "$kind" = sim ]; then
        verify_sim_tree || { echo "$mode: the restored GPU tree differs" >&2; exit 1; }
    else
        reply=$(ask all)
        grep -q '^all ok' <<<"$reply" || { echo "$mode: the restored memory differs: $reply" >&2; exit 1; }
    fi
    echo "$mode $cache $first $all"
}

# RUNS rounds of every mode and cache on $WORK/image of workload $1, as rows "RUN $2 ...".
rounds() {
    local kind=$1 name=$2 round cache mode shift_by result modes
    for round in $(seq "$RUNS"); do
        for cache in $CACHES; do
            # The modes in an order that rotates from round to round.
            read -ra modes <<<"$MODES"
            shift_by=$(( round % ${#modes[@]} ))
            for mode in "${modes[@]:shift_by}" "${modes[@]:0:shift_by}"; do
                result=$(restore_once "$kind" "$mode" "$cache")
                kill_tree
                echo "RUN $name $result"
            done
        done
    done
}

echo "# time to ready: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), criu $("$criu" --version | head -1), gpucr $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)"
for mib in $SIZES; do
    start_server "$mib"
    "$gpucr" dump "$(cat "$WORK/pid")" "$WORK/image" >/dev/null 2>&1
    rm -f "$WORK/pid"
    echo "# $mib MiB server, hot set $HOT_MIB MiB, $RUNS rounds, modes: $MODES"
    rounds server "$mib" | tee "$WORK/runs-$mib.txt"
    rm -rf "$WORK/image"
done
if [ -n "$SIM_TREE" ]; then
    start_sim_tree
    "$gpucr" dump "$(cat "$WORK/pid")" "$WORK/image" >/dev/null 2>&1
    rm -f "$WORK/pid"
    cp -a "$WORK/state" "$WORK/state-at-dump"
    echo "# simulator GPU tree ($SIM_TREE, copy engines $GPUCR_SIM_COPY_BW), $RUNS rounds, modes: $MODES"
    rounds sim gpu-tree | tee "$WORK/runs-gpu-tree.txt"
    rm -rf "$WORK/image" "$GPUCR_SIM_ROOT"
fi

python3 - "$WORK" <<'PY'
import glob, statistics, sys
runs, why = {}, {}
for path in sorted(glob.glob(sys.argv[1] + "/runs-*.txt")):
    for line in open(path):
        if not line.startswith("RUN "):
            continue
        _, name, mode, cache, first, whole = line.split()[:6]
        size = "%s MiB" % name if name.isdigit() else name
        key = (int(name) if name.isdigit() else 1 << 40, size, cache, mode)
        if first == "-":
            why[key] = " ".join(line.split()[6:])
            continue
        runs.setdefault(key, []).append((int(first), int(whole)))
print("| size | page cache | restore | first answer, ms (median, min-max) | all memory back, ms |")
print("|---|---|---|---|---|")
for key in sorted(set(runs) | set(why)):
    _, size, cache, mode = key
    if key not in runs:
        print("| %s | %s | %s | cannot: %s | |" % (size, cache, mode, why[key]))
        continue
    values = runs[key]
    firsts, wholes = [v[0] for v in values], [v[1] for v in values]
    print("| %s | %s | %s | %d (%d-%d) | %d (%d-%d) |" % (
        size, cache, mode, statistics.median(firsts), min(firsts), max(firsts),
        statistics.median(wholes), min(wholes), max(wholes)))
PY
