#!/usr/bin/env bash
# Benchmark: moving a server between two hosts. The hosts are network namespaces
# (source, destination) joined by veth pairs to a bridge in a third (the clients'), as
# tests/common/hosts.rs makes them; the server (examples/serve_memory.rs, holding MIB of
# memory) listens on the job's address 10.201.0.100, which moves with it.
#
# Modes (MODES, rotated from round to round):
#   * in-place: `gpucr dump --leave-stopped` on the source and `gpucr restore --detach`
#     of its image on the destination, no copy: the floor a move reaches unless the
#     source's dump and the destination's restore overlap.
#   * in-place-killed: `gpucr dump` (the job killed) and `gpucr restore --detach` on the
#     source.
#   * baseline: `gpucr dump --leave-stopped` on the source, the image copied over the
#     link (tar through socat, plain TCP), the job's address moved, `gpucr restore
#     --detach` on the destination.
#   * stop-and-copy: `gpucr migrate PID 10.201.0.12` on the source, `gpucr receive --once`
#     on the destination (mutual TLS); the job's address is given to the destination
#     before the move (the source's copy is frozen; CRIU binds the restored listener
#     there) and taken from the source once `gpucr migrate` returns.
#   * post-copy: `gpucr migrate --post-copy`, the receiver as above; the job's address is
#     moved to the destination as the move starts (the server's first answer must come
#     from the destination while its memory is still being pulled), and the client
#     asks while `gpucr migrate` runs (it returns once every page is in there).
# Then the simulator's GPU tree (SIM_TREE, default 1 GiB of device memory), whose "first
# answer" is its parent's journal growing on the destination (a line every 100 ms).
# Figures per round, in ms: the downtime, from the start of the move (the freeze) to the
# server's first answer on the destination to a client on the bridge; and the bytes of
# the image over the time they took to cross the link (for `gpucr migrate`, its
# `sent_ms`: from the image's first byte sent to its end). The link's own rate is measured
# once with iperf3 (5 s, one stream, destination to source as a migration sends), and
# the rate of gpucr's own link on it without disk (examples/link_rate.rs, 4 GiB): the
# ceiling a migration, which must run through TLS, can reach on this machine.
# Every round ends with the server checking all its memory ("all" must answer "ok").
# Beside each downtime: the dump's and the restore's own milliseconds (from the --json
# reports' events: for a move, the source's freeze to CRIU's end, and the receiver's
# restore), and the CPU time both hosts spent from the freeze to the first answer (all
# cores, /proc/stat), with how many of the cores that kept busy on average; for `gpucr
# migrate`, how long the image still crossed once CRIU was done (its "sent" less its
# dump's "criu-done"), and the rate of that part (the bytes not streamed while CRIU
# dumped, over that time), and for stop-and-copy the share of the image that crossed
# while CRIU was still dumping (1 when the stream kept pace with the dump). Last, a
# RATIOS line per job with the targets' ratios: each move against the baseline, what it
# adds to in-place against what the baseline's copy adds, and the least downtime its CPU
# time allows on this machine's cores, against the baseline.
#
# NICE defaults to 0 here (bench-session.sh): the job restored on the destination runs
# in a session of its own, which the kernel gives a scheduler group at nice 0, while
# the commands of the move run in this script's session; raising this session above
# the job's measured gpucr's restore against the job it restores (docs/migration.md,
# "Figures"). Run it on a machine with nothing else to do.
#
#   scripts/bench-migrate.sh                 (SIZES="1024 4096" RUNS=3 MODES=baseline
#                                             LANES=, COMPRESS=, STAGING= for
#                                             gpucr migrate's --lanes, --compress
#                                             and --staging)
#
# Needs iperf3 and socat (Debian's packages of those names). Results: docs/benchmarks.md
# ("Live migration").
set -euo pipefail
NICE=${NICE:-0}
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
SIZES=${SIZES-1024 4096}
RUNS=${RUNS:-3}
# gpucr migrate's --lanes (empty: its default), and the GPU memory's --compress of both
# gpucr dump (baseline) and gpucr migrate (empty: their default, zstd).
LANES=${LANES:-}
COMPRESS=${COMPRESS:-}
# Where gpucr migrate stages the image (--staging; empty: the temporary directory).
STAGING=${STAGING:-}
# HOLD_SOURCE=1 (the default): in-place and baseline keep the source's copy of the job
# stopped until the round ends, as a move must (`gpucr dump --leave-stopped`), and
# in-place restores on the destination. Their restores then write the job's memory into
# memory nothing has just freed, as a move's destination does. HOLD_SOURCE=0: their
# dump kills the job first, and the restore takes the pages the dump freed, which on a
# VM that hands free memory back to its host are much faster to write than others
# (docs/migration.md, "Figures"). The mode in-place-killed is in-place with the job
# killed by its dump whatever HOLD_SOURCE says, to show the difference in one run.
HOLD_SOURCE=${HOLD_SOURCE:-1}
MODES=${MODES:-baseline}
# The simulator's GPU tree moved after the servers (examples/sim_workload with these
# options; SIM_TREE="" skips it): 1 GiB of device memory by default.
SIM_TREE=${SIM_TREE---gpus 2 --parent-mib 768 --child-mib 256 --cpu-mib 64}
export GPUCR_SIM_ROOT=${GPUCR_SIM_ROOT:-/dev/shm/gpucr-bench-migrate-sim}
JOB_KIND=server
WORK=${WORK:-/var/tmp/gpucr-bench-migrate}
JOB=10.201.0.100
CLIENT=10.201.0.1
PORT=7000
gpucr=$root/target/release/gpucr
server=$root/target/release/examples/serve_memory
sim_workload=$root/target/release/examples/sim_workload
link_rate=$root/target/release/examples/link_rate
for tool in iperf3 socat; do
    command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install --no-install-recommends $tool" >&2; exit 1; }
done
cargo build --release --bin gpucr --example serve_memory --example link_rate \
    --example sim_workload -q
rm -rf "$WORK" && mkdir -p "$WORK"
ms() { echo $(( $(date +%s%N) / 1000000 )); }

# The hosts.
tag=gpucr-bench-$$
src=$tag-src dst=$tag-dst cli=$tag-cli
on() { local host=$1; shift; nsenter --net="/run/netns/$host" "$@"; }
cleanup() {
    kill_tree
    for n in $src $dst $cli; do ip netns del "$n" 2>/dev/null || true; done
    rm -rf "$GPUCR_SIM_ROOT"
}
trap cleanup EXIT
for n in $src $dst $cli; do ip netns add "$n"; ip -n "$n" link set lo up; done
ip -n "$cli" link add br0 type bridge
ip -n "$cli" link set br0 up
ip -n "$cli" addr add "$CLIENT/24" dev br0
for n in $src $dst; do
    ip -n "$n" link add eth0 type veth peer name "to-${n##*-}" netns "$cli"
    ip -n "$cli" link set "to-${n##*-}" master br0
    ip -n "$cli" link set "to-${n##*-}" up
    ip -n "$n" link set eth0 up
done
# Each host has an address of its own beside the job's, for the copy and iperf3.
ip -n "$src" addr add 10.201.0.11/24 dev eth0
ip -n "$dst" addr add 10.201.0.12/24 dev eth0
place_job() { # the job's address on host $1 only
    ip -n "$src" addr del "$JOB/24" dev eth0 2>/dev/null || true
    ip -n "$dst" addr del "$JOB/24" dev eth0 2>/dev/null || true
    ip -n "$1" addr add "$JOB/24" dev eth0
    ip -n "$cli" neigh flush all
}

# The client, on the bridge: connect (retrying while nothing listens), send each request,
# print the replies and the milliseconds since the epoch when the first reply came.
ask() {
    on "$cli" python3 "$serve_memory_client" "$JOB:$PORT" 300 "$@"
}

# The CPU time both hosts spent so far (every core, user and system), in ms.
cpu_busy_ms() {
    awk -v hz="$(getconf CLK_TCK)" '/^cpu /{print int(($2+$3+$4+$7+$8) * 1000 / hz)}' /proc/stat
}

# The milliseconds between the events $2 and $3 of a gpucr --json report $1 (its
# "events"; the report's "total_ms" for $3 = total).
span_ms() {
    python3 - "$@" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
at = {e["name"]: e["at_ms"] for e in report.get("events", [])}
at["total"] = report.get("total_ms", 0)
start, end = at.get(sys.argv[2]), at.get(sys.argv[3])
print(-1 if start is None or end is None else int(end - start))
PY
}

# The pid a `gpucr restore --detach --json` or `gpucr receive --json` report $1 names.
report_pid() {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$1"
}

kill_tree() {
    kill_pidfiles "$WORK"/pid "$WORK"/restored
}

start_server() {
    local mib=$1 pid
    place_job "$src"
    rm -rf "$WORK/state" && mkdir -p "$WORK/state"
    nsenter --net="/run/netns/$src" unshare --pid --fork setsid "$server" --state "$WORK/state" --memory-mib "$mib" \
        --listen "$JOB:$PORT" </dev/null >/dev/null 2>&1 &
    pid=$(tree_root_when_ready $! "$WORK/state/ready" "the server")
    echo "$pid" > "$WORK/pid"
}

# The simulator's GPU tree ($SIM_TREE) on the source, in a sim root of its own.
start_gpu_tree() {
    place_job "$src"
    start_sim_tree_through 1 "$sim_workload" nsenter --net="/run/netns/$src"
}

# The GPU tree's "first answer": the milliseconds since the epoch when the parent's
# journal (a line every 100 ms, so up to 100 ms late) grows past $1 bytes.
journal_grows() {
    python3 - "$WORK/state/journal-parent" "$1" <<'PY'
import os, sys, time
path, size = sys.argv[1], int(sys.argv[2])
deadline = time.time() + 300
while time.time() < deadline:
    if os.stat(path).st_size > size:
        print(int(time.time() * 1000))
        sys.exit(0)
    time.sleep(0.002)
sys.exit("the journal did not grow")
PY
}

# Once the tree is frozen (the dump done: a file but the pages and GPU data is in $1),
# the journal's size, which grows again only once the tree runs on the destination.
journal_at_freeze() {
    # One process polling, not a find per try: what polls takes no core from the dump.
    python3 - "$1" "$WORK/state/journal-parent" <<'PY'
import os, sys, time
top, journal = sys.argv[1], sys.argv[2]
def cpu_image_file():
    for parent, dirs, files in os.walk(top):
        if "/gpu" in parent[len(top):]:
            continue
        if any(not name.startswith("pages-") for name in files):
            return True
    return False
deadline = time.time() + 30
while time.time() < deadline and not cpu_image_file():
    time.sleep(0.005)
print(os.stat(journal).st_size)
PY
}

# Every process of the GPU tree checks every byte of its buffers and CPU memory.
gpu_tree_intact() {
    local j
    echo 1 > "$WORK/state/verify"
    for _ in $(seq 1200); do
        local all=1
        for j in "$WORK"/state/journal-*; do
            tail -1 "$j" | grep -q 'bad=1' && return 1
            tail -1 "$j" | grep -q 'verified=1 ' || all=0
        done
        [ $all = 1 ] && return 0
        sleep 0.1
    done
    return 1
}

# In-place's and baseline's `gpucr dump` of the job into src-image (with move_once's
# `held` flags). The source's copy, left stopped (HOLD_SOURCE=1), is killed with the
# round's restored job; or it went with the dump.
dump_on_source() {
    on "$src" "$gpucr" dump --json "${held[@]}" ${COMPRESS:+--compress "$COMPRESS"} "$(cat "$WORK/pid")" "$WORK/src-image" >"$WORK/dumped.json" 2>"$WORK/err" \
        || { cat "$WORK/err" >&2; exit 1; }
    if [ "$hold" != 1 ]; then rm -f "$WORK/pid"; fi
}

# One move in mode $1; prints "mode downtime_ms bytes transfer_ms".
move_once() {
    local mode=$1 t0 t1 t2 reply bytes at_freeze busy0 busy dumped restored tail=-1 late=0
    local held=() hold=$HOLD_SOURCE
    [ "$mode" = in-place-killed ] && hold=0
    [ "$hold" = 1 ] && held=(--leave-stopped)
    rm -rf "$WORK/src-image" "$WORK/dst-image"
    case $mode in
    in-place|in-place-killed)
        # What a move cannot go below without overlapping the two: the dump and the
        # restore alone, no copy (the destination restores the source's image; with
        # HOLD_SOURCE=0 the source restores it).
        local there=$dst
        [ "$hold" = 1 ] || there=$src
        t0=$(ms) busy0=$(cpu_busy_ms)
        dump_on_source
        [ "$there" = "$dst" ] && place_job "$dst"
        [ "$JOB_KIND" = gpu ] && at_freeze=$(stat -c %s "$WORK/state/journal-parent")
        on "$there" "$gpucr" restore --detach --json "$WORK/src-image" > "$WORK/restored.json" 2>"$WORK/err" &
        local restoring=$!
        if [ "$JOB_KIND" = gpu ]; then reply="hot ok"$'\n'"first $(journal_grows "$at_freeze")"; else reply=$(ask hot); fi
        busy=$(( $(cpu_busy_ms) - busy0 ))
        wait "$restoring" || { cat "$WORK/err" >&2; exit 1; }
        report_pid "$WORK/restored.json" > "$WORK/restored"
        dumped=$(span_ms "$WORK/dumped.json" start total)
        restored=$(span_ms "$WORK/restored.json" start criu-done)
        bytes=0 t1=0 t2=1 ;;
    baseline)
        t0=$(ms) busy0=$(cpu_busy_ms)
        dump_on_source
        mkdir -m 0700 "$WORK/dst-image"
        on "$dst" socat -u TCP-LISTEN:7100,bind=10.201.0.12,reuseaddr \
            EXEC:"tar -C $WORK/dst-image -xf -" &
        local receiving=$!
        for _ in $(seq 200); do on "$dst" ss -ltn | grep -q ':7100 ' && break; sleep 0.01; done
        t1=$(ms)
        on "$src" sh -c "tar -C '$WORK/src-image' -cf - . | socat -u - TCP:10.201.0.12:7100"
        wait "$receiving"
        t2=$(ms)
        bytes=$(du -sb "$WORK/src-image" | cut -f1)
        place_job "$dst"
        [ "$JOB_KIND" = gpu ] && at_freeze=$(stat -c %s "$WORK/state/journal-parent")
        on "$dst" "$gpucr" restore --detach --json "$WORK/dst-image" > "$WORK/restored.json" 2>"$WORK/err" &
        local restoring=$!
        if [ "$JOB_KIND" = gpu ]; then reply="hot ok"$'\n'"first $(journal_grows "$at_freeze")"; else reply=$(ask hot); fi
        busy=$(( $(cpu_busy_ms) - busy0 ))
        wait "$restoring" || { cat "$WORK/err" >&2; exit 1; }
        report_pid "$WORK/restored.json" > "$WORK/restored"
        dumped=$(span_ms "$WORK/dumped.json" start total)
        restored=$(span_ms "$WORK/restored.json" start criu-done) ;;
    stop-and-copy|post-copy)
        local flags=()
        [ -n "$LANES" ] && flags+=(--lanes "$LANES")
        [ -n "$COMPRESS" ] && flags+=(--compress "$COMPRESS")
        [ -n "$STAGING" ] && flags+=(--staging "$STAGING")
        rm -rf "$WORK/in" && mkdir -p "$WORK/in"
        ip -n "$dst" addr add "$JOB/24" dev eth0
        on "$dst" "$gpucr" receive --json --listen 10.201.0.12:7431 --dir "$WORK/in" --once \
            --key "$WORK/keys/dst.key" --cert "$WORK/keys/dst.crt" \
            --peer-cert "$WORK/keys/src.crt" > "$WORK/received.json" 2>"$WORK/err-receive" &
        local receiving=$!
        for _ in $(seq 200); do on "$dst" ss -ltn | grep -q ':7431 ' && break; sleep 0.01; done
        t0=$(ms) busy0=$(cpu_busy_ms)
        [ "$mode" = post-copy ] && { flags+=(--post-copy); place_job "$dst"; }
        on "$src" "$gpucr" migrate --json "${flags[@]}" "$(cat "$WORK/pid")" 10.201.0.12:7431 \
            --key "$WORK/keys/src.key" --cert "$WORK/keys/src.crt" \
            --peer-cert "$WORK/keys/dst.crt" > "$WORK/migrated" 2>"$WORK/err" &
        local migrating=$!
        if [ "$JOB_KIND" = gpu ]; then
            at_freeze=$(journal_at_freeze "$WORK/in")
            reply="hot ok"$'\n'"first $(journal_grows "$at_freeze")"
            busy=$(( $(cpu_busy_ms) - busy0 ))
        elif [ "$mode" = post-copy ]; then
            reply=$(ask hot)
            busy=$(( $(cpu_busy_ms) - busy0 ))
        fi
        wait "$migrating" || { cat "$WORK/err" "$WORK/err-receive" >&2; exit 1; }
        wait "$receiving" || { cat "$WORK/err-receive" >&2; exit 1; }
        report_pid "$WORK/received.json" > "$WORK/restored"
        rm -f "$WORK/pid"
        if [ "$mode" = stop-and-copy ] && [ "$JOB_KIND" = server ]; then
            place_job "$dst"
            reply=$(ask hot)
            busy=$(( $(cpu_busy_ms) - busy0 ))
        fi
        dumped=$(span_ms "$WORK/migrated" freeze criu-done)
        tail=$(span_ms "$WORK/migrated" criu-done sent)
        restored=$(span_ms "$WORK/received.json" start criu-done)
        read -r bytes sent streamed < <(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["bytes"], int(j["sent_ms"]), j["streamed_bytes"])' "$WORK/migrated")
        late=$(( bytes - streamed ))
        t1=0 t2=$sent ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    grep -q '^hot ok' <<<"$reply" || { echo "$mode: hot set answered: $reply" >&2; exit 1; }
    local downtime=$(( $(sed -n 's/^first //p' <<<"$reply") - t0 ))
    if [ "$JOB_KIND" = gpu ]; then
        gpu_tree_intact || { echo "$mode: the GPU tree's memory differs after the move" >&2; exit 1; }
    else
        reply=$(ask all)
        grep -q '^all ok' <<<"$reply" || { echo "$mode: the moved memory differs: $reply" >&2; exit 1; }
    fi
    # Each round's --json reports, kept for a closer look (reports/KIND-SIZE-MODE-ROUND.*).
    local report size=${mib:-0}
    if [ "$JOB_KIND" = gpu ]; then size=0; fi
    mkdir -p "$WORK/reports"
    for report in dumped.json restored.json migrated received.json; do
        if [ -f "$WORK/$report" ]; then
            mv "$WORK/$report" "$WORK/reports/$JOB_KIND-$size-$mode-$round.$report"
        fi
    done
    echo "$mode $downtime $bytes $(( t2 - t1 )) $dumped $restored $busy $tail $late"
}

mkdir -p "$WORK/keys"
(cd "$WORK/keys" && "$gpucr" keygen src >/dev/null && "$gpucr" keygen dst >/dev/null)
echo "# live migration: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), criu $(criu --version | head -1), gpucr $(git rev-parse --short HEAD)"
on "$src" iperf3 -s -1 -B 10.201.0.11 >/dev/null 2>&1 &
sleep 0.5
link=$(on "$dst" iperf3 -c 10.201.0.11 -B 10.201.0.12 -t 5 -J \
    | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e6))')
echo "LINK $link MB/s (iperf3, one stream, 5 s)"
# The ceiling of gpucr's link on this machine, with no disk and no CRIU on either side:
# 4 GiB of 1 MiB chunks with their xxh3, through the same mutual TLS and framing as
# `gpucr migrate` (examples/link_rate.rs), destination to source.
keys=(--key "$WORK/keys/src.key" --cert "$WORK/keys/src.crt" --peer-cert "$WORK/keys/dst.crt")
on "$src" "$link_rate" receive 10.201.0.11:5202 "${keys[@]}" > "$WORK/link-rate" &
rate_receiver=$!
sleep 0.5
on "$dst" "$link_rate" send 10.201.0.11:5202 --mib 4096 --key "$WORK/keys/dst.key" \
    --cert "$WORK/keys/dst.crt" --peer-cert "$WORK/keys/src.crt"
wait "$rate_receiver"
tls=$(sed -n 's/.*: \([0-9]*\) MB\/s$/\1/p' "$WORK/link-rate")
echo "TLS $tls MB/s (gpucr's link, one connection, 4 GiB, no disk): $(( tls * 100 / link ))% of the link"
# The destination's disk, where the receiver writes: 2 GiB written and synced as a
# received image's files are (the rate a migration that keeps its image can reach).
rm -f "$WORK/disk-probe"
disk=$(dd if=/dev/zero of="$WORK/disk-probe" bs=1M count=2048 conv=fdatasync 2>&1 \
    | sed -n 's/.*copied, \([0-9.]*\) s.*/\1/p' | python3 -c 'import sys; print(int(2048 * 1048576 / 1e6 / float(sys.stdin.read())))')
rm -f "$WORK/disk-probe"
echo "DISK $disk MB/s (2 GiB written and synced beneath $WORK): $(( disk * 100 / link ))% of the link"
for mib in $SIZES; do
    echo "# $mib MiB server, $RUNS rounds, modes: $MODES"
    for round in $(seq "$RUNS"); do
        read -ra modes <<<"$MODES"
        shift_by=$(( round % ${#modes[@]} ))
        for mode in "${modes[@]:shift_by}" "${modes[@]:0:shift_by}"; do
            start_server "$mib"
            # Each round starts with nothing of the last one still going to disk.
            sync
            result=$(move_once "$mode")
            kill_tree
            echo "RUN $mib $result"
        done
    done | tee "$WORK/runs-$mib.txt"
done
if [ -n "$SIM_TREE" ]; then
    JOB_KIND=gpu
    echo "# simulator GPU tree ($SIM_TREE), $RUNS rounds, modes: $MODES"
    for round in $(seq "$RUNS"); do
        read -ra modes <<<"$MODES"
        shift_by=$(( round % ${#modes[@]} ))
        for mode in "${modes[@]:shift_by}" "${modes[@]:0:shift_by}"; do
            start_gpu_tree
            sync
            result=$(move_once "$mode")
            kill_tree
            echo "RUN 0 $result"
        done
    done | tee "$WORK/runs-gpu.txt"
fi

python3 - "$WORK" "$link" "$(nproc)" <<'PY'
import glob, statistics, sys
link, cores = int(sys.argv[2]), int(sys.argv[3])
runs = {}
for path in sorted(glob.glob(sys.argv[1] + "/runs-*.txt")):
    for line in open(path):
        if line.startswith("RUN "):
            _, mib, mode, *fields = line.split()
            runs.setdefault((int(mib), mode), []).append([int(f) for f in fields])
med = lambda values, i: statistics.median(v[i] for v in values)
print("| size | mode | downtime, ms (median, min-max) | transfer, MB/s (median) | of the link (%d MB/s) "
      "| dump, ms | restore, ms | CPU busy, ms (cores busy of %d) | sent after CRIU's end: ms, MB/s "
      "| of the image, crossed while CRIU dumped |" % (link, cores))
print("|---|---|---|---|---|---|---|---|---|---|")
for (mib, mode), values in sorted(runs.items()):
    downs = [v[0] for v in values]
    rate = statistics.median(v[1] / 1e6 / max(v[2], 1) * 1e3 for v in values)
    busy = med(values, 5)
    tail = med(values, 6)
    late = statistics.median(v[7] / 1e6 / v[6] * 1e3 for v in values) if tail > 0 else 0
    early = ("%.3f" % statistics.median(1 - v[7] / v[1] for v in values)
             if mode == "stop-and-copy" else "")
    print("| %s | %s | %d (%d-%d) | %d | %.2f | %d | %d | %d (%.2f) | %s | %s |" % (
        "%d MiB" % mib if mib else "GPU tree", mode, statistics.median(downs), min(downs),
        max(downs), rate, rate / link, med(values, 3), med(values, 4), busy,
        busy / max(statistics.median(downs), 1),
        "%d, %d" % (tail, late) if tail > 0 and early else "%d" % tail if tail >= 0 else "",
        early))
# The targets' ratios (docs/benchmarks.md), from the medians above: each move's downtime
# against the baseline's; what the move adds to the in-place floor against what the
# baseline's copy adds to it (the proposed target where the floor alone misses); and the
# least downtime its CPU time allows on this machine's cores, against the baseline's.
down = {key: statistics.median(v[0] for v in values) for key, values in runs.items()}
for mib in sorted({mib for mib, _ in runs}):
    base, floor = down.get((mib, "baseline")), down.get((mib, "in-place"))
    if not base:
        continue
    parts = []
    for mode in ("stop-and-copy", "post-copy"):
        move = down.get((mib, mode))
        if move is None:
            continue
        part = "%s %.2f of the baseline" % (mode, move / base)
        if floor is not None and base > floor:
            part += ", adds %.2f of what the copy adds to in-place" % ((move - floor) / (base - floor))
        # However its steps overlap, its CPU time needs at least this much of the cores.
        busy = statistics.median(v[5] for v in runs[(mib, mode)])
        part += ", its CPU time alone %.2f on %d cores" % (busy / cores / base, cores)
        parts.append(part)
    if floor is not None:
        parts.append("in-place alone %.2f" % (floor / base))
    print("RATIOS %s: %s" % ("%d MiB" % mib if mib else "GPU tree", "; ".join(parts)))
PY
