#!/usr/bin/env bash
# Benchmark (a) of docs/benchmarks.md: dump throughput of the transfer engine on 4 GiB of
# buffers (2 GiB compressible, 2 GiB random), with zstd and with no compression, against
# `zstd -1 -T$JOBS` and `cat` of the same bytes to the same disk.
#
#   scripts/bench-transfer.sh            (RUNS=7 JOBS=$(nproc) OUT=/var/tmp/gpucr-bench-transfer)
#
# The input is generated once into a tmpfs file; every command reads those bytes and
# writes to $OUT. Every command ends with its output durable (gpucr fsyncs its data files
# and index; the baselines are followed by `sync FILE`), and the page cache is flushed
# before each run. The commands run interleaved: RUNS rounds, each one hyperfine run of
# every command in an order that rotates from round to round, so that load from
# elsewhere on the machine, and what the previous command left the disk doing, hit all
# of them alike; the table gives the median per command.
#
# On a machine shared with other work (builds), the script runs in its own session whose
# scheduler group gets nice $NICE (default -15; NICE=0 leaves it alone), so that the
# measured commands, gpucr and baselines alike, get the cores rather than share them.
#
# The output ends with one line per comparison, `ROW|name|target|result|PASS or FAIL`
# (scripts/bench-all.sh collects them).
set -euo pipefail
# shellcheck source=bench-session.sh source-path=SCRIPTDIR
source "$(dirname "$0")/bench-session.sh"
bench_session_start "$@"
cd "$(dirname "$0")/.."
RUNS=${RUNS:-7}
JOBS=${JOBS:-$(nproc)}
INPUT=${INPUT:-/dev/shm/gpucr-bench-transfer.input}
OUT=${OUT:-/var/tmp/gpucr-bench-transfer}
COMPRESSIBLE_MIB=${COMPRESSIBLE_MIB:-2048}
RANDOM_MIB=${RANDOM_MIB:-2048}
results=$(mktemp -d)

cleanup() { rm -rf "$INPUT" "$OUT" "$results"; }
trap cleanup EXIT

command -v zstd >/dev/null || apt-get install -y --no-install-recommends zstd
command -v hyperfine >/dev/null || apt-get install -y --no-install-recommends hyperfine
cargo build --release --example bench_transfer
bench=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/examples/bench_transfer

"$bench" generate --out "$INPUT" --compressible-mib "$COMPRESSIBLE_MIB" --random-mib "$RANDOM_MIB"
mkdir -p "$OUT"
bench_session_nice

names=("gpucr zstd:1" "zstd -1 -T$JOBS" "gpucr none" "cat")
cmds=(
    "$bench dump --input $INPUT --dir $OUT/img --compress zstd:1 --jobs $JOBS"
    "zstd -1 -T$JOBS -q -f $INPUT -o $OUT/out.zst && sync $OUT/out.zst"
    "$bench dump --input $INPUT --dir $OUT/img --compress none --jobs $JOBS"
    "cat $INPUT > $OUT/out && sync $OUT/out"
)

# Output sizes, and the dump's peak memory (bounded by the chunk pool, not the input).
for i in "${!cmds[@]}"; do
    rm -rf "${OUT:?}"/*
    /usr/bin/time -f '%M' -o "$results/rss.$i" bash -c "${cmds[$i]}" >/dev/null
    du -sb "$OUT" | cut -f1 >"$results/size.$i"
done

for round in $(seq "$RUNS"); do
    # The order rotates from round to round: each command follows each other one
    # alike (a command's write-back and the deletion of its output go on beneath the
    # next one).
    args=()
    for k in "${!cmds[@]}"; do
        i=$(( (k + round) % ${#cmds[@]} ))
        args+=(-n "${names[$i]}" "${cmds[$i]}")
    done
    hyperfine --runs 1 --style basic --prepare "rm -rf ${OUT:?}/*; sync" \
        --export-json "$results/round.$round.json" "${args[@]}"
done

python3 - "$results" "$RUNS" "$(( (COMPRESSIBLE_MIB + RANDOM_MIB) << 20 ))" "${names[@]}" <<'EOF'
import json, statistics, sys
results, runs, total, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
times = {n: [] for n in names}
for r in range(1, runs + 1):
    for res in json.load(open(f"{results}/round.{r}.json"))["results"]:
        times[res["command"]] += res["times"]
med = {n: statistics.median(t) for n, t in times.items()}
print(f"| command | median s | runs (s) | MiB/s of input | output MiB | peak RSS MiB |")
print(f"|---|---|---|---|---|---|")
for i, n in enumerate(names):
    size = int(open(f"{results}/size.{i}").read())
    rss = int(open(f"{results}/rss.{i}").read()) / 1024
    runs_s = " ".join(f"{t:.2f}" for t in times[n])
    print(f"| `{n}` | {med[n]:.2f} | {runs_s} | {total / 2**20 / med[n]:.0f} | {size / 2**20:.0f} | {rss:.0f} |")
print()
for ours, base in ((names[0], names[1]), (names[2], names[3])):
    print(f"* `{ours}` vs `{base}` (same output): {med[base] / med[ours]:.2f}x")
fastest = min(med[names[1]], med[names[3]])
print(f"* `{names[0]}` vs the faster baseline overall: {fastest / med[names[0]]:.2f}x")
print()
for row, ours, base in (("GPU dump throughput, zstd:1", names[0], names[1]),
                        ("GPU dump throughput, uncompressed", names[2], names[3])):
    ratio = med[base] / med[ours]
    print(f"ROW|{row}|>= 1.0x the speed of `{base}`|{ratio:.2f}x ({med[ours]:.2f} s vs "
          f"{med[base]:.2f} s)|{'PASS' if ratio >= 1.0 else 'FAIL'}")
EOF
