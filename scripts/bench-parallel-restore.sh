#!/usr/bin/env bash
# Benchmark: restore wall time with gpucr's parallel restore (the GPU image is read,
# verified and decompressed from the start, while CRIU restores CPU memory) against
# --no-parallel-restore (buffers filled inside RESTORE_EXT_FILE, CRIU 4.1's way), on the
# simulator with copy engines throttled to 1.6 GB/s per GPU, for one process, for a
# 4-process tree, and for that tree with its CPU memory where CRIU restores it before any
# file (the gain's floor), side by side and interleaved: RUNS rounds per case, each one run of
# both modes (hyperfine --runs 1), their order alternating from round to round, so the
# machine's drift hits both alike; medians over the rounds. After
# each case: the phase timeline of both modes, what CRIU spent restoring memory and
# what filling the GPU buffers took inside RESTORE_EXT_FILE (the two costs the
# benchmark balances), and how busy the machine's cores were.
#
# The same rounds also restore, for each case, three variants of its tree (the parts of
# its restore, each dumped from a workload of its own): "cpu", the tree with 1 MiB of
# GPU memory per process (CRIU's half); "gpu", the tree with its GPU memory and no CPU
# memory of its own (the fill, with next to nothing for CRIU to restore); "none", the
# tree with neither (the restore's fixed steps). The target is the overlap efficiency:
# the parallel restore's median at most 1.1 times the larger of CRIU's half and the fill
# (single, tree), or, for tree-cow, where CRIU hands gpucr the buffers only after the
# memory, 1.1 times their sum less the fixed steps counted twice in it. Each case ends
# with a line `ROW|case|target|result|PASS or FAIL` (scripts/bench-all.sh collects them).
# Results: docs/benchmarks.md.
#
#   scripts/bench-parallel-restore.sh            (RUNS=9)
set -euo pipefail
# The measured commands run in a session of their own (scripts/bench-session.sh); the
# steps hyperfine calls back (a first argument) stay where they are.
# shellcheck source=bench-session.sh source-path=SCRIPTDIR
source "$(dirname "$0")/bench-session.sh"
if [ -z "${1:-}" ]; then
    bench_session_start "$@"
    bench_session_nice
fi
cd "$(dirname "$0")/.."
root=$PWD
RUNS=${RUNS:-9}
WORK=${WORK:-/var/tmp/gpucr-bench-parallel}
# The image and tree a step works on: the case's own, or with BENCH_PART one of the
# parts it is compared with (above).
dir=$WORK${BENCH_PART:+/$BENCH_PART}
export GPUCR_SIM_ROOT=${GPUCR_SIM_ROOT:-/dev/shm/gpucr-bench-sim}
export GPUCR_SIM_COPY_BW=${GPUCR_SIM_COPY_BW:-1.6GB/s}
gpucr=$root/target/release/gpucr
workload=$root/target/release/examples/sim_workload

# Milliseconds the machine's cores were busy and in all, from /proc/stat.
cpu_ms() {
    awk '/^cpu /{ busy = $2 + $3 + $4 + $7 + $8; print busy * 10, (busy + $5 + $6) * 10 }' /proc/stat
}

kill_restored() {
    [ -f "$WORK/restored" ] || return 0
    local pid; pid=$(cat "$WORK/restored")
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 200); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
    rm -f "$WORK/restored"
}

case "${1:-}" in
prepare)
    # Before each restore: no restored tree, the tree's files as at the dump, and no
    # device memory (as on a new machine).
    kill_restored
    rm -rf "$dir/state" && cp -a "$dir/state-at-dump" "$dir/state"
    rm -rf "$GPUCR_SIM_ROOT/contexts"
    rm -f "$dir/image/restore.log" "$dir/image/stats-restore"
    exit 0 ;;
restore)
    shift
    "$gpucr" restore --detach "$@" "$dir/image" > "$WORK/restored"
    exit 0 ;;
timeline)
    shift
    "$0" prepare
    read -r busy0 total0 < <(cpu_ms)
    # -v: CRIU logs at debug level, where the restorer's reads of each task's pages
    # (below) appear; the measured runs above log at gpucr's default level.
    "$gpucr" restore --detach --json -v "$@" "$WORK/image" > "$WORK/timeline.json" 2>/dev/null
    read -r busy1 total1 < <(cpu_ms)
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$WORK/timeline.json" > "$WORK/restored"
    python3 - "$WORK/timeline.json" "$WORK/image/restore.log" <<'PY'
import json, re, sys
r = json.load(open(sys.argv[1]))
ev = r["events"]
for a, b in zip(ev, ev[1:]):
    print(f"    {b['at_ms'] - a['at_ms']:8.1f} ms  {a['name']} -> {b['name']}")
print(f"    {r['total_ms']:8.1f} ms  total")
for t in (r.get("gpu") or {}).get("timings", []):
    print(f"    task {t['ns_pid']}: {t['bytes'] / 2**20:.0f} MiB of device memory filled "
          f"{t['start_ms']:.1f} -> {t['end_ms']:.1f} ms (helper clock)")
# CRIU's restore of each task's memory: the restorer's preadv calls of its pages.
span = {}
for line in open(sys.argv[2], errors="replace"):
    m = re.match(r"\((\d+\.\d+)\) pie: (\d+): (Preadv|`- returned) ", line)
    if m:
        at, pid = float(m[1]) * 1000, int(m[2])
        first, _ = span.get(pid, (at, at))
        span[pid] = (first, at)
for pid, (first, last) in sorted(span.items()):
    print(f"    task {pid}: CPU memory restored {first:.1f} -> {last:.1f} ms (CRIU log clock)")
PY
    echo "    cores busy $((busy1 - busy0)) ms of $((total1 - total0)) ms"
    "$0" prepare >/dev/null
    exit 0 ;;
"") ;;
*) echo "unknown step $1" >&2; exit 2 ;;
esac

command -v hyperfine >/dev/null || apt-get install -y -qq --no-install-recommends hyperfine >/dev/null
{ [ -x "$gpucr" ] && [ -x "$workload" ]; } || cargo build --release --workspace --lib --bins --examples -q
self=$root/scripts/bench-parallel-restore.sh
export WORK

# Start the sim workload with these options and dump it into $WORK/image; with a part
# name first (not empty), into $WORK/PART/image, keeping the case's image and sim root.
start_and_dump() {
    local part=$1 d; shift
    kill_restored
    if [ -z "$part" ]; then
        d=$WORK
        rm -rf "$WORK" "$GPUCR_SIM_ROOT"
    else
        d=$WORK/$part
        rm -rf "$d" "$GPUCR_SIM_ROOT/contexts"
    fi
    mkdir -p "$d/state"
    unshare --pid --fork setsid "$workload" --state "$d/state" "$@" </dev/null >/dev/null 2>&1 &
    local up=$! pid=""
    for _ in $(seq 1200); do
        pid=$(awk '{print $1}' "/proc/$up/task/$up/children" 2>/dev/null || true)
        [ -n "$pid" ] && [ -f "$d/state/ready-parent" ] && break
        sleep 0.05
    done
    sleep 2
    "$gpucr" dump "$pid" "$d/image" > "$d/dump.txt"
    for _ in $(seq 200); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
    cp -a "$d/state" "$d/state-at-dump"
}

# The workload options "$@" with --cpu-mib, --parent-mib and --child-mib set to $1, $2
# and $3 where those are not empty (a --child-mib of 0, no children, stays 0), into the
# array `part_opts`.
with_sizes() {
    local cpu=$1 parent=$2 child=$3; shift 3
    part_opts=()
    while [ $# -gt 0 ]; do
        case $1 in
        --cpu-mib) part_opts+=("$1" "${cpu:-$2}"); shift 2 ;;
        --parent-mib) part_opts+=("$1" "${parent:-$2}"); shift 2 ;;
        --child-mib)
            if [ "$2" = 0 ]; then part_opts+=("$1" 0); else part_opts+=("$1" "${child:-$2}"); fi
            shift 2 ;;
        *) part_opts+=("$1"); shift ;;
        esac
    done
}

# The benchmark's sizes balance its two halves: CPU memory that takes CRIU as long to
# restore as the copy engine takes to fill the GPU memory. The engine's rate is set
# (GPUCR_SIM_COPY_BW); CRIU's is this machine's, so it is measured: three restores of
# one process with 1 GiB of CPU memory and 1 MiB of GPU memory, CRIU's time from
# setting up namespaces to post-restore. Prints the factor that scales the CPU sizes
# (1: CRIU restores 1 GiB as fast as the engine fills 1 GiB).
calibrate() {
    start_and_dump "" --cpu-mib 1024 --parent-mib 1 --child-mib 0 --gpus 1 --fill random >/dev/null
    local i
    for i in 1 2 3; do
        "$self" prepare >/dev/null
        "$gpucr" restore --detach --json "$WORK/image" > "$WORK/calibrate-$i.json"
        python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' \
            "$WORK/calibrate-$i.json" > "$WORK/restored"
    done
    kill_restored
    python3 - "$WORK" "$GPUCR_SIM_COPY_BW" <<'PY'
import json, re, statistics, sys
work, bw = sys.argv[1], sys.argv[2]
spans = []
for i in (1, 2, 3):
    at = {e["name"]: e["at_ms"] for e in json.load(open(f"{work}/calibrate-{i}.json"))["events"]}
    spans.append(at["post-restore"] - at["post-setup-namespaces"])
m = re.fullmatch(r"([0-9.]+)\s*(?:([KMG]?)(i?)B/s)?", bw)
rate = float(m[1]) * (1024 if m[3] else 1000) ** " KMG".index(m[2] or " ")
fill_ms = 2**30 / rate * 1000
cpu_ms = statistics.median(spans)
print(f"{fill_ms / cpu_ms:.3f} {cpu_ms:.1f} {fill_ms:.1f}")
PY
}

run_case() {
    local name=$1; shift
    start_and_dump "" "$@"
    # The parts of this restore, each its own workload and image (see the top).
    local part_opts
    with_sizes "" 1 1 "$@"; start_and_dump cpu "${part_opts[@]}"
    with_sizes 0 "" "" "$@"; start_and_dump gpu "${part_opts[@]}"
    with_sizes 0 1 1 "$@"; start_and_dump none "${part_opts[@]}"
    echo "## $name: $*"
    sed -n '1,2p' "$WORK/dump.txt"
    echo "image: $(du -sh "$WORK/image" | cut -f1) ($(du -sh "$WORK/image/gpu" | cut -f1) of it GPU memory)"
    local round k what args
    local commands=(sequential parallel cpu gpu none)
    rm -f "$WORK/../parallel-$name"-*.json
    for round in $(seq "$RUNS"); do
        # The five restores in an order that rotates from round to round.
        args=()
        for k in "${!commands[@]}"; do
            what=${commands[$(( (k + round) % ${#commands[@]} ))]}
            case $what in
            sequential) args+=(--prepare "$self prepare" -n "sequential (--no-parallel-restore)" "$self restore --no-parallel-restore") ;;
            parallel) args+=(--prepare "$self prepare" -n "parallel" "$self restore") ;;
            *) args+=(--prepare "BENCH_PART=$what $self prepare" -n "part $what" "BENCH_PART=$what $self restore") ;;
            esac
        done
        hyperfine --runs 1 --style none --export-json "$WORK/../parallel-$name-$round.json" \
            "${args[@]}" >/dev/null
    done
    echo "timeline, parallel:"
    "$self" timeline
    echo "timeline, sequential:"
    "$self" timeline --no-parallel-restore
    kill_restored
}

# GPU memory random (stored raw), on one simulated GPU: its copy engine (1.6 GB/s)
# bounds the GPU side, as on a real device. (Spread over several GPUs, the simulator's
# own copying, about 2 GB/s per core here, would bound it instead: two cores cannot
# stand in for several engines.) Sizes make filling the buffers inside RESTORE_EXT_FILE
# cost about what CRIU spends restoring CPU memory (the timelines show both).
CASES=${CASES:-single tree tree-cow}
# The sizes were chosen where CRIU restored 1 GiB of CPU memory as fast as the engine
# fills 1 GiB of GPU memory (single: 1 GiB of each; tree: 256 MiB of CPU memory per
# process); elsewhere the CPU sizes are scaled by the measured factor, unless given.
if [ -z "${SINGLE_CPU_MIB:-}" ] || [ -z "${TREE_CPU_MIB:-}" ]; then
    read -r factor cpu_ms fill_ms < <(calibrate)
    SINGLE_CPU_MIB=${SINGLE_CPU_MIB:-$(python3 -c "print(round(1024 * $factor))")}
    TREE_CPU_MIB=${TREE_CPU_MIB:-$(python3 -c "print(round(256 * $factor))")}
    echo "# calibration: CRIU restored 1 GiB of CPU memory in $cpu_ms ms (median of 3), the engine fills 1 GiB in $fill_ms ms: CPU sizes scaled by $factor"
fi
echo "# CPU memory: single ${SINGLE_CPU_MIB} MiB, tree ${TREE_CPU_MIB} MiB per process"
wanted() { [[ " $CASES " == *" $1 "* ]]; }
wanted single && run_case single --cpu-mib "$SINGLE_CPU_MIB" --parent-mib 1024 --child-mib 0 --gpus 1 --fill random --max-buffer-mib 256
wanted tree && run_case tree --cpu-mib "$TREE_CPU_MIB" --parent-mib 192 --child-mib 192 --children 3 --gpus 1 --fill random --max-buffer-mib 128
# The same tree with every process's CPU memory at the parent's bounds: CRIU takes such
# memory for copy-on-write candidates and reads it while it sets up the tasks' mappings,
# before it restores any file, so there is nothing left for the buffers' fill to overlap
# (docs/benchmarks.md). It shows the gain's floor, not a target.
wanted tree-cow && run_case tree-cow --cpu-mib "$TREE_CPU_MIB" --cpu-bounds parent --parent-mib 192 --child-mib 192 --children 3 --gpus 1 --fill random --max-buffer-mib 128
rm -rf "$GPUCR_SIM_ROOT"

python3 - "$(dirname "$WORK")" "$RUNS" "$CASES" <<'PY'
import json, statistics, sys
results, runs, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
for name in cases.split():
    times = {}
    for r in range(1, runs + 1):
        for res in json.load(open(f"{results}/parallel-{name}-{r}.json"))["results"]:
            times.setdefault(res["command"], []).extend(res["times"])
    seq = times["sequential (--no-parallel-restore)"]
    par = times["parallel"]
    s, p = statistics.median(seq), statistics.median(par)
    print(f"{name:>8}: sequential median {s*1000:7.1f} ms (min {min(seq)*1000:.1f}, max "
          f"{max(seq)*1000:.1f}), parallel median {p*1000:7.1f} ms (min {min(par)*1000:.1f}, "
          f"max {max(par)*1000:.1f}), n={len(par)}: {(1 - p / s)*100:.0f}% faster")
    # The overlap efficiency (docs/benchmarks.md, "Parallel restore of GPU memory").
    cpu, fill, fixed = (statistics.median(times[f"part {w}"]) for w in ("cpu", "gpu", "none"))
    if name == "tree-cow":
        bound, what = cpu + fill - fixed, "CRIU's half + the fill - the fixed steps"
        target = "<= 1.1 x (CRIU's half + the fill - the fixed steps)"
    else:
        bound, what = max(cpu, fill), "the larger of CRIU's half and the fill"
        target = "<= 1.1 x max(CRIU's half, the fill)"
    eff = p / bound
    print(f"{'':>8}  CRIU's half {cpu*1000:.1f} ms, the fill {fill*1000:.1f} ms, the fixed steps "
          f"{fixed*1000:.1f} ms (medians): parallel / ({what}) = {eff:.3f} (target <= 1.1: "
          f"{'met' if eff <= 1.1 else 'not met'})")
    row = {"single": "Parallel restore, one process",
           "tree": "Parallel restore, 4-process tree (own bounds)",
           "tree-cow": "Parallel restore, 4-process tree (parent's bounds)"}.get(name, f"Parallel restore, {name}")
    rows.append(f"ROW|{row}|{target}|{eff:.3f} (parallel {p*1000:.1f} ms; CRIU's half {cpu*1000:.1f} ms, "
                f"the fill {fill*1000:.1f} ms, fixed steps {fixed*1000:.1f} ms; {(1 - p / s)*100:.0f}% "
                f"faster than sequential)|{'PASS' if eff <= 1.1 else 'FAIL'}")
print("\n".join(rows))
PY
