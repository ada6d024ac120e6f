#!/usr/bin/env bash
# Benchmark: time to ready. A server holding MEM_MIB of memory (examples/serve_memory.rs)
# is dumped once by gpucr; then RUNS interleaved rounds restore that one image each way
# below, with the page cache warm and dropped, and time, from the start of the restore:
#   * the first answer: a client connects (retrying while the port is closed) and asks
#     for the hot set, which the server checks against its pattern;
#   * all memory back: for `gpucr restore` its end (it returns once every page is in);
#     for `gpucr restore --lazy --detach` the moment it reports all memory in (its
#     "all memory in" line, or its end); for CRIU's own lazy restore the end of its
#     `criu lazy-pages` daemon, which exits once every page is transferred.
# Each round ends with the restored server asked to check every page ("all"), which must
# answer "ok". Results: docs/benchmarks.md ("Time to ready").
#
#   scripts/bench-ready.sh                  (SIZES="1024 4096" RUNS=3 CACHES="warm cold")
#
# MODES: `restore` (gpucr restore --detach), `lazy` (gpucr restore --lazy --detach) and
# `criu-lazy` (criu restore --lazy-pages with criu lazy-pages on the same image).
# HOT_MIB (default 8): the hot set.
set -euo pipefail
# shellcheck source=bench-session.sh source-path=SCRIPTDIR
source "$(dirname "$0")/bench-session.sh"
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
gpucr=$root/target/release/gpucr
server=$root/target/release/examples/serve_memory
criu=$(command -v criu)

{ [ -x "$gpucr" ] && [ -x "$server" ]; } || cargo build --release --bin gpucr --example serve_memory -q
rm -rf "$WORK" && mkdir -p "$WORK"
ms() { echo $(( $(date +%s%N) / 1000000 )); }

# The client: connect (retrying while nothing listens), send each request, print the
# replies and the milliseconds since the epoch when the first reply came.
ask() {
    python3 - "$WORK/state/address" "$@" <<'PY'
import socket, sys, time
host, port = open(sys.argv[1]).read().strip().rsplit(":", 1)
deadline = time.time() + 120
while True:
    try:
        s = socket.create_connection((host, int(port)), timeout=120)
        break
    except OSError:
        if time.time() > deadline:
            sys.exit("no server at %s:%s" % (host, port))
        time.sleep(0.001)
f = s.makefile("rw")
first = None
for request in sys.argv[2:]:
    f.write(request + "\n")
    f.flush()
    reply = f.readline().strip()
    first = first or int(time.time() * 1000)
    print(request, reply)
print("first", first)
PY
}

kill_tree() {
    local pid
    for f in "$WORK"/pid "$WORK"/restored; do
        [ -f "$f" ] || continue
        pid=$(cat "$f")
        kill -KILL "$pid" 2>/dev/null || true
        for _ in $(seq 400); do [ -d "/proc/$pid" ] || break; sleep 0.025; done
        rm -f "$f"
    done
}

start_server() {
    local mib=$1 up pid=""
    rm -rf "$WORK/state" && mkdir -p "$WORK/state"
    unshare --pid --fork setsid "$server" --state "$WORK/state" --memory-mib "$mib" \
        --hot-mib "$HOT_MIB" </dev/null >/dev/null 2>&1 &
    up=$!
    for _ in $(seq 1200); do
        pid=$(awk '{print $1}' "/proc/$up/task/$up/children" 2>/dev/null || true)
        [ -n "$pid" ] && [ -f "$WORK/state/ready" ] && break
        sleep 0.05
    done
    [ -f "$WORK/state/ready" ] || { echo "the server did not start" >&2; exit 1; }
    echo "$pid" > "$WORK/pid"
}

# One restore of $WORK/image in mode $1 with the page cache $2; prints
# "mode cache first_ms all_ms".
restore_once() {
    local mode=$1 cache=$2 t0 first all reply lazy
    rm -rf "$WORK/run" && mkdir -p "$WORK/run"
    [ "$cache" = cold ] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
    case $mode in
    restore)
        t0=$(ms)
        "$gpucr" restore --detach "$WORK/image" > "$WORK/restored" 2> "$WORK/run/err" &
        local restoring=$!
        reply=$(ask hot)
        wait "$restoring" || { cat "$WORK/run/err" >&2; exit 1; }
        all=$(( $(ms) - t0 )) ;;
    lazy)
        t0=$(ms)
        "$gpucr" restore --lazy --detach "$WORK/image" > "$WORK/restored" 2> "$WORK/run/err" &
        local restoring=$!
        reply=$(ask hot)
        wait "$restoring" || { cat "$WORK/run/err" >&2; exit 1; }
        all=$(( $(ms) - t0 )) ;;
    criu-lazy)
        "$criu" lazy-pages -D "$WORK/image" -W "$WORK/run" -o lazy.log &
        lazy=$!
        for _ in $(seq 200); do [ -S "$WORK/run/lazy-pages.socket" ] && break; sleep 0.01; done
        t0=$(ms)
        "$criu" restore -D "$WORK/image" -W "$WORK/run" --lazy-pages -d -o restore.log \
            --pidfile "$WORK/restored" &
        local restoring=$!
        reply=$(ask hot)
        wait "$restoring" || { tail -5 "$WORK/run/restore.log" >&2; exit 1; }
        wait "$lazy" || { tail -5 "$WORK/run/lazy.log" >&2; exit 1; }
        all=$(( $(ms) - t0 )) ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    first=$(( $(sed -n 's/^first //p' <<<"$reply") - t0 ))
    grep -q '^hot ok' <<<"$reply" || { echo "$mode: hot set answered: $reply" >&2; exit 1; }
    reply=$(ask all)
    grep -q '^all ok' <<<"$reply" || { echo "$mode: the restored memory differs: $reply" >&2; exit 1; }
    echo "$mode $cache $first $all"
}

echo "# time to ready: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), criu $("$criu" --version | head -1), gpucr $(git rev-parse --short HEAD)"
for mib in $SIZES; do
    start_server "$mib"
    "$gpucr" dump "$(cat "$WORK/pid")" "$WORK/image" >/dev/null 2>&1
    rm -f "$WORK/pid"
    echo "# $mib MiB server, hot set $HOT_MIB MiB, $RUNS rounds, modes: $MODES"
    for round in $(seq "$RUNS"); do
        for cache in $CACHES; do
            # The modes in an order that rotates from round to round.
            read -ra modes <<<"$MODES"
            shift_by=$(( round % ${#modes[@]} ))
            for mode in "${modes[@]:shift_by}" "${modes[@]:0:shift_by}"; do
                result=$(restore_once "$mode" "$cache")
                kill_tree
                echo "RUN $mib $result"
            done
        done
    done | tee "$WORK/runs-$mib.txt"
    rm -rf "$WORK/image"
done

python3 - "$WORK" <<'PY'
import glob, statistics, sys
runs = {}
for path in sorted(glob.glob(sys.argv[1] + "/runs-*.txt")):
    for line in open(path):
        if line.startswith("RUN "):
            _, mib, mode, cache, first, whole = line.split()
            runs.setdefault((int(mib), cache, mode), []).append((int(first), int(whole)))
print("| size | page cache | restore | first answer, ms (median, min-max) | all memory back, ms |")
print("|---|---|---|---|---|")
for (mib, cache, mode), values in sorted(runs.items()):
    firsts, wholes = [v[0] for v in values], [v[1] for v in values]
    print("| %d MiB | %s | %s | %d (%d-%d) | %d (%d-%d) |" % (
        mib, cache, mode, statistics.median(firsts), min(firsts), max(firsts),
        statistics.median(wholes), min(wholes), max(wholes)))
PY
