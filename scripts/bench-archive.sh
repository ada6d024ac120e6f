#!/usr/bin/env bash
# Benchmark `gpucr inspect ARCHIVE` (a container checkpoint archive read as a stream)
# against unpacking the archive and inspecting the directory.
#
#   scripts/bench-archive.sh [--mib N] [--runs N] [--keep]
#
# Dumps the simulator's workload holding N MiB of GPU memory (default 1024) with
# `gpucr dump --compress none`, packs the image into an archive in podman's layout (checkpoint/ with the
# image, config.dump, spec.dump; zstd, as `podman container checkpoint --export` writes
# it by default), then times with hyperfine (median of --runs runs, default 5, after one
# warm-up run, page cache warm):
#   * gpucr inspect --all --json ARCHIVE
#   * tar --zstd -xf ARCHIVE; gpucr inspect --all --json DIR/checkpoint; rm -rf DIR
#   * gpucr inspect --verify ARCHIVE
#   * tar --zstd -xf ARCHIVE; gpucr inspect --verify DIR/checkpoint; rm -rf DIR
# and each command's peak RSS with /usr/bin/time. Prints a Markdown section for
# docs/benchmarks.md on stdout; progress goes to stderr. Needs root, CRIU, hyperfine,
# zstd and GNU tar.
set -euo pipefail
cd "$(dirname "$0")/.."

mib=1024
runs=5
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --mib) mib=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        *) echo "usage: $0 [--mib N] [--runs N] [--keep]" >&2; exit 2 ;;
    esac
done

log() { printf 'bench-archive: %s\n' "$*" >&2; }

for tool in criu hyperfine zstd tar /usr/bin/time; do
    command -v "$tool" >/dev/null || { log "error: $tool is not installed"; exit 1; }
done

work=$(mktemp -d /var/tmp/gpucr-bench-archive.XXXXXX)
export GPUCR_SIM_ROOT=$work/sim
unshare_pid=
cleanup() {
    [ -n "$unshare_pid" ] && kill -9 "$unshare_pid" 2>/dev/null || true
    if [ "$keep" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

log "building gpucr (release) and the simulator's workload"
cargo build --release -q --workspace --bins --examples --lib
target=${CARGO_TARGET_DIR:-$PWD/target}/release
gpucr=$target/gpucr

log "starting the workload with $mib MiB of GPU memory"
unshare --pid --fork --kill-child setsid "$target/examples/sim_workload" --state "$work/state" \
    --gpus 1 --parent-mib "$mib" --child-mib 0 </dev/null >"$work/workload.log" 2>&1 &
unshare_pid=$!
for _ in $(seq 1200); do [ -e "$work/state/ready-parent" ] && break; sleep 0.1; done
[ -e "$work/state/ready-parent" ] || { log "error: the workload did not start"; cat "$work/workload.log" >&2; exit 1; }
root_pid=$(tr -d ' \n' <"/proc/$unshare_pid/task/$unshare_pid/children")

mkdir -p "$work/pack"
log "dumping pid $root_pid"
# Stored uncompressed, as GPU memory that does not compress would be: the archive then
# carries every byte (zstd compresses the simulator's patterns as podman's export would).
"$gpucr" dump --compress none "$root_pid" "$work/pack/checkpoint" >&2
wait "$unshare_pid" 2>/dev/null || true
unshare_pid=
printf '{"id":"0123456789ab","name":"bench","rootfsImageName":"localhost/bench:latest","runtime":"runc"}' \
    >"$work/pack/config.dump"
printf '{"annotations":{"io.container.manager":"libpod"}}' >"$work/pack/spec.dump"
archive=$work/checkpoint.tar.zst
log "packing $archive"
tar -C "$work/pack" -cf - checkpoint config.dump spec.dump | zstd -q -T0 -o "$archive"
cat "$archive" >/dev/null # warm the page cache

unpacked=$work/unpacked
unpack="rm -rf $unpacked && mkdir $unpacked && tar --zstd -xf $archive -C $unpacked"
names=("gpucr inspect --all --json ARCHIVE" "unpack + gpucr inspect --all --json DIR" \
    "gpucr inspect --verify ARCHIVE" "unpack + gpucr inspect --verify DIR")
cmds=("$gpucr inspect --all --json $archive >/dev/null" \
    "$unpack && $gpucr inspect --all --json $unpacked/checkpoint >/dev/null && rm -rf $unpacked" \
    "$gpucr inspect --verify $archive >/dev/null" \
    "$unpack && $gpucr inspect --verify $unpacked/checkpoint >/dev/null && rm -rf $unpacked")

log "timing (${runs} runs each)"
load_before=$(cut -d' ' -f1 /proc/loadavg)
hyperfine --style none --warmup 1 --runs "$runs" --export-json "$work/times.json" \
    -n "${names[0]}" "${cmds[0]}" -n "${names[1]}" "${cmds[1]}" \
    -n "${names[2]}" "${cmds[2]}" -n "${names[3]}" "${cmds[3]}" >&2
load_after=$(cut -d' ' -f1 /proc/loadavg)

rss=()
for cmd in "${cmds[@]}"; do
    # The peak of the largest process of the command (tar or gpucr).
    /usr/bin/time -f %M -o "$work/rss" sh -c "$cmd"
    rss+=("$(tail -n1 "$work/rss")")
done

archive_size=$(stat -c %s "$archive")
image_size=$(du -sb "$work/pack/checkpoint" | cut -f1)
cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)
criu_version=$(criu --version | sed -n 's/^Version: //p')
commit=$(git rev-parse --short HEAD)

python3 - "$work/times.json" "$archive_size" "$image_size" "$mib" "$cpu" "$(nproc)" \
    "$criu_version" "$runs" "$load_before" "$load_after" "$commit" "${names[@]}" -- "${rss[@]}" <<'EOF'
import json, sys, datetime
args = sys.argv[1:]
(times, archive_size, image_size, mib, cpu, cores, criu, runs, load_before, load_after,
 commit) = args[:11]
rest = args[11:]
sep = rest.index("--")
names, rss = rest[:sep], rest[sep + 1:]
results = json.load(open(times))["results"]
mi = lambda b: f"{int(b) / 2**20:.1f} MiB"
print("## gpucr inspect ARCHIVE vs unpacking the archive\n")
print(f"{datetime.date.today()}, commit `{commit}`: {cpu}, {cores} cores, CRIU {criu}. "
      f"The simulator's workload with {mib} MiB of GPU memory dumped by `gpucr dump "
      f"--compress none`, packed "
      f"in podman's layout: archive {mi(archive_size)} (zstd), image {mi(image_size)}. "
      f"Median of {runs} runs after one warm-up, page cache warm; load average "
      f"{load_before} before, {load_after} after. Command: `scripts/bench-archive.sh "
      f"--mib {mib} --runs {runs}`.\n")
print("| command | median | min | max | peak RSS |")
print("|---|---|---|---|---|")
for name, r, kib in zip(names, results, rss):
    print(f"| `{name}` | {r['median']:.3f} s | {r['min']:.3f} s | {r['max']:.3f} s | "
          f"{int(kib) / 1024:.0f} MiB |")
print()
print(f"Reading the archive as a stream: `inspect` {results[1]['median'] / results[0]['median']:.2f}x "
      f"faster than unpacking first, `--verify` "
      f"{results[3]['median'] / results[2]['median']:.2f}x, and nothing is written to disk.")
EOF
