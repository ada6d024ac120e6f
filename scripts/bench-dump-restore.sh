#!/usr/bin/env bash
# Benchmark: gpucr dump/restore vs the plain `criu dump`/`criu restore` command line, on
# the same workload (the sample workload with a 1 GiB anonymous region), side by side,
# interleaved: RUNS rounds, each one run of both tools (hyperfine --runs 1), the order
# alternating from round to round, so that the machine's drift hits both alike; medians
# over the rounds. The dump rounds also run `gpucr dump --no-page-checksums`. Results:
# docs/benchmarks.md.
#
#   scripts/bench-dump-restore.sh               (MEM_MIB=1024 RUNS=9)
#
# Both tools get the same options: --tcp-established, nftables network lock, log level 2,
# images in the same directory on the same disk, page cache warm.
#
# The output ends with one line per gpucr command, `ROW|name|target|result|verdict`
# (scripts/bench-all.sh collects them): PASS when the whole 95% interval of the per-round
# median ratio is below 1.05, FAIL when it is all at or above 1.05, - when the run cannot
# tell.
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
MEM_MIB=${MEM_MIB:-1024}
RUNS=${RUNS:-9}
WORK=${WORK:-/var/tmp/gpucr-bench}
gpucr=$root/target/release/gpucr
workload=$root/target/release/examples/workload
criu=$(command -v criu)

# --- helpers called by hyperfine's --prepare -------------------------------------------
# A dump that kills its tree leaves CRIU's nftables lock table (inet CRIU-<id>) behind
# for the restore to remove; with no restore they pile up, and every later network lock
# and unlock (CRIU's and gpucr's alike) slows down with their number (120 ms instead of 3
# with about a hundred). Each measured command starts with none.
drop_lock_tables() {
    command -v nft >/dev/null || return 0
    local t
    for t in $(nft list tables 2>/dev/null | awk '$2 == "inet" && $3 ~ /^CRIU-/ {print $3}'); do
        nft delete table inet "$t" 2>/dev/null || true
    done
}

kill_all() {
    drop_lock_tables
    for f in "$WORK"/pid "$WORK"/restored; do
        [ -f "$f" ] || continue
        local pid; pid=$(cat "$f")
        kill -KILL "$pid" 2>/dev/null || true
        for _ in $(seq 200); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
        rm -f "$f"
    done
}

start_workload() {
    kill_all
    rm -rf "$WORK/state" && mkdir -p "$WORK/state"
    unshare --pid --fork setsid "$workload" --state "$WORK/state" --memory-mib "$MEM_MIB" \
        </dev/null >/dev/null 2>&1 &
    local pid
    pid=$(tree_root_when_ready $! "$WORK/state/ready" "the workload")
    echo "$pid" > "$WORK/pid"
    sleep 0.3
}

case "${1:-}" in
prepare-dump)
    start_workload
    rm -rf "$WORK/image" && mkdir -p "$WORK/image"
    exit 0 ;;
prepare-restore)
    kill_all
    # CRIU checks the sizes of the tree's open files: put them back as at the dump.
    rm -rf "$WORK/state" && cp -a "$WORK/state-at-dump" "$WORK/state"
    rm -f "$WORK/ref-image/restore.log" "$WORK/ref-image/stats-restore"
    exit 0 ;;
gpucr-restore)
    "$gpucr" restore --detach "$WORK/ref-image" > "$WORK/restored"
    exit 0 ;;
criu-restore)
    "$criu" restore -D "$WORK/ref-image" -d --tcp-established --network-lock nftables \
        -o restore.log --pidfile "$WORK/restored"
    exit 0 ;;
"") ;;
*) echo "unknown step $1" >&2; exit 2 ;;
esac

command -v hyperfine >/dev/null || apt-get install -y -qq --no-install-recommends hyperfine >/dev/null
{ [ -x "$gpucr" ] && [ -x "$workload" ]; } || cargo build --release --workspace --lib --bins --examples -q
mkdir -p "$WORK"
self=$root/scripts/bench-dump-restore.sh
export MEM_MIB WORK

# shellcheck disable=SC2034  # the three arrays are used through `declare -n` below
dump_criu=(-n "criu dump" "$criu dump -t \$(cat $WORK/pid) -D $WORK/image --tcp-established --network-lock nftables -o dump.log")
# shellcheck disable=SC2034
dump_gpucr=(-n "gpucr dump" "$gpucr dump --tcp-established --network-lock nftables \$(cat $WORK/pid) $WORK/image")
# The same without the memory pages' checksums (--no-page-checksums): what hashing every
# page beside CRIU costs.
# shellcheck disable=SC2034
dump_sizes=(-n "gpucr dump --no-page-checksums" "$gpucr dump --no-page-checksums --tcp-established --network-lock nftables \$(cat $WORK/pid) $WORK/image")
echo "# dump of a ${MEM_MIB} MiB process tree, $RUNS interleaved rounds"
for round in $(seq "$RUNS"); do
    # The three commands in an order that rotates from round to round.
    case $((round % 3)) in
    1) order=(dump_criu dump_gpucr dump_sizes) ;;
    2) order=(dump_gpucr dump_sizes dump_criu) ;;
    0) order=(dump_sizes dump_criu dump_gpucr) ;;
    esac
    args=()
    for name in "${order[@]}"; do
        declare -n command="$name"
        args+=(--prepare "$self prepare-dump" "${command[@]}")
        unset -n command
    done
    hyperfine --runs 1 --style none --export-json "$WORK/dump-$round.json" "${args[@]}" >/dev/null
done

# One reference image for both restores, made by gpucr (a CRIU image plus gpucr.json).
"$self" prepare-dump
rm -rf "$WORK/ref-image"
"$gpucr" dump --tcp-established --network-lock nftables "$(cat "$WORK/pid")" "$WORK/ref-image" >/dev/null
rm -f "$WORK/pid"
rm -rf "$WORK/state-at-dump" && cp -a "$WORK/state" "$WORK/state-at-dump"

echo "# restore of a ${MEM_MIB} MiB process tree, $RUNS interleaved rounds"
for round in $(seq "$RUNS"); do
    if [ $((round % 2)) = 1 ]; then names=("criu restore" "gpucr restore") steps=(criu-restore gpucr-restore)
    else names=("gpucr restore" "criu restore") steps=(gpucr-restore criu-restore); fi
    hyperfine --runs 1 --style none --export-json "$WORK/restore-$round.json" \
        --prepare "$self prepare-restore" -n "${names[0]}" "$self ${steps[0]}" \
        --prepare "$self prepare-restore" -n "${names[1]}" "$self ${steps[1]}" >/dev/null
done
"$self" prepare-restore >/dev/null

python3 - "$WORK" "$RUNS" <<'PY'
import json, random, statistics, sys
work, runs = sys.argv[1], int(sys.argv[2])
rows = []
row_names = {"gpucr dump": "CPU-only dump vs `criu dump`",
             "gpucr dump --no-page-checksums": "CPU-only dump --no-page-checksums vs `criu dump`",
             "gpucr restore": "CPU-only restore vs `criu restore`"}
for what, base in (("dump", "criu dump"), ("restore", "criu restore")):
    times = {}
    for r in range(1, runs + 1):
        for res in json.load(open(f"{work}/{what}-{r}.json"))["results"]:
            times.setdefault(res["command"], []).extend(res["times"])
    ref = statistics.median(times[base])
    names = [base] + sorted(n for n in times if n != base)
    for name in names:
        t = times[name]
        m = statistics.median(t)
        print(f"{name:>30}: median {m*1000:8.1f} ms  (min {min(t)*1000:.1f}, "
              f"max {max(t)*1000:.1f}, n={len(t)})  ratio {m/ref:.3f}")
        if name == base:
            continue
        # Each round ran every command back to back: the ratio within a round is free
        # of the machine's drift between rounds.
        paired = sorted(g / c for g, c in zip(t, times[base]))
        result = f"{m/ref:.3f} ({m*1000:.1f} vs {ref*1000:.1f} ms"
        verdict = "-"
        if len(paired) >= 4:
            q = statistics.quantiles(paired, n=4)
            # How sure the per-round median is: 95% bootstrap interval (fixed seed, so
            # that the same times print the same interval).
            rng = random.Random(1)
            medians = sorted(
                statistics.median(rng.choices(paired, k=len(paired))) for _ in range(2000)
            )
            print(f"{'':>30}  per round: median ratio {statistics.median(paired):.3f} "
                  f"(quartiles {q[0]:.3f}-{q[2]:.3f}; 95% interval of the median "
                  f"{medians[50]:.3f}-{medians[1949]:.3f})")
            lo, hi = medians[50], medians[1949]
            result += (f"; per round {statistics.median(paired):.3f}, 95% interval "
                       f"{lo:.3f}-{hi:.3f}")
            verdict = "PASS" if hi < 1.05 else "FAIL" if lo >= 1.05 else "-"
        result += f"; {len(paired)} rounds)"
        rows.append(f"ROW|{row_names.get(name, name)}|< 1.05 (per-round median, 95% interval)|{result}|{verdict}")
print("\n".join(rows))
PY
