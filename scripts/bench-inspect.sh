#!/usr/bin/env bash
# Benchmark `gpucr inspect` against crit on a real image of a >= 2 GiB process.
#
#   scripts/bench-inspect.sh [--mib N] [--runs N] [--keep]
#
# Starts the inspect test workload (tests/inspect_support/workload.c: 4 processes,
# 9 threads, files, pipes, unix and TCP sockets, a memfd) with an N MiB region in its
# root (default 2048), dumps it with `gpucr dump`, then times with hyperfine (median of
# --runs runs, default 10, after one warm-up run, page cache warm):
#   * gpucr inspect --all --json DIR      everything gpucr inspect shows
#   * gpucr inspect --verify DIR          checksums of every file + CRIU framing checks
#   * crit, the same information: crit x DIR ps, crit x DIR fds, crit x DIR mems and
#     crit show of every image gpucr inspect reads (inventory, pstree, files, memfd,
#     core-*, ids-*, fs-*, fdinfo-*, mm-*, pagemap-*, tcp-stream-*, stats-dump)
#   * crit x DIR ps/fds/mems alone
# and each command's peak RSS with /usr/bin/time. Prints a Markdown section for
# docs/benchmarks.md on stdout; progress goes to stderr. Needs root, CRIU, crit,
# hyperfine and a C compiler.
set -euo pipefail
cd "$(dirname "$0")/.."

mib=2048
runs=10
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --mib) mib=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        *) echo "usage: $0 [--mib N] [--runs N] [--keep]" >&2; exit 2 ;;
    esac
done

log() { printf 'bench-inspect: %s\n' "$*" >&2; }

for tool in criu crit hyperfine cc /usr/bin/time; do
    command -v "$tool" >/dev/null || { log "error: $tool is not installed"; exit 1; }
done

work=$(mktemp -d /tmp/gpucr-bench-inspect.XXXXXX)
unshare_pid=
cleanup() {
    [ -n "$unshare_pid" ] && kill -9 "$unshare_pid" 2>/dev/null || true
    if [ "$keep" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

log "building gpucr (release) and the workload"
cargo build --release -q --bin gpucr
gpucr=${CARGO_TARGET_DIR:-$PWD/target}/release/gpucr
cc -O2 -pthread -o "$work/workload" tests/inspect_support/workload.c

port=$((20000 + RANDOM % 20000))
log "starting the workload with a $mib MiB region"
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin GPUCR_INSPECT_MARK=root GPUCR_INSPECT_MIB="$mib" \
    unshare --pid --fork --kill-child setsid "$work/workload" root "$port" "$work/held" "$work/ready" \
    </dev/null >"$work/workload.log" 2>&1 &
unshare_pid=$!
for _ in $(seq 600); do [ -e "$work/ready" ] && break; sleep 0.1; done
[ -e "$work/ready" ] || { log "error: the workload did not start"; cat "$work/workload.log" >&2; exit 1; }
root_pid=$(tr -d ' \n' <"/proc/$unshare_pid/task/$unshare_pid/children")

image=$work/image
log "dumping pid $root_pid"
"$gpucr" dump --tcp-established "$root_pid" "$image" >&2
wait "$unshare_pid" 2>/dev/null || true
unshare_pid=
cat "$image"/* >/dev/null # warm the page cache

shopt -s nullglob
shown=()
for f in inventory.img pstree.img files.img memfd.img stats-dump \
    "$image"/core-*.img "$image"/ids-*.img "$image"/fs-*.img "$image"/fdinfo-*.img \
    "$image"/mm-*.img "$image"/pagemap-*.img "$image"/tcp-stream-*.img; do
    f=${f##*/}
    [ -e "$image/$f" ] && shown+=("$f")
done
crit_all="crit x $image ps && crit x $image fds && crit x $image mems"
for f in "${shown[@]}"; do crit_all+=" && crit show $image/$f"; done
crit_all="{ $crit_all; } >/dev/null"
crit_x="{ crit x $image ps && crit x $image fds && crit x $image mems; } >/dev/null"

names=("gpucr inspect --all --json" "gpucr inspect --verify" \
    "crit x ps/fds/mems + crit show (${#shown[@]} images)" "crit x ps/fds/mems")
cmds=("$gpucr inspect --all --json $image" "$gpucr inspect --verify $image" \
    "$crit_all" "$crit_x")

log "timing (${runs} runs each)"
load_before=$(cut -d' ' -f1 /proc/loadavg)
# gpucr runs without a shell (-N: it takes milliseconds); crit's command lines need one.
hyperfine -N --style none --warmup 1 --runs "$runs" --export-json "$work/gpucr.json" \
    "${cmds[0]}" "${cmds[1]}" >&2
hyperfine --style none --warmup 1 --runs "$runs" --export-json "$work/crit.json" \
    "${cmds[2]}" "${cmds[3]}" >&2

rss=()
for cmd in "${cmds[@]}"; do
    /usr/bin/time -f %M -o "$work/rss" sh -c "$cmd >/dev/null"
    rss+=("$(tail -n1 "$work/rss")")
done

image_size=$(du -sb "$image" | cut -f1)
pages_size=$(du -cb "$image"/pages-*.img | tail -n1 | cut -f1)
cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)
criu_version=$(criu --version | sed -n 's/^Version: //p')
load_after=$(cut -d' ' -f1 /proc/loadavg)

python3 - "$work/gpucr.json" "$work/crit.json" "$image_size" "$pages_size" "$mib" "$cpu" "$(nproc)" \
    "$criu_version" "$runs" "${#shown[@]}" "$load_before" "$load_after" "${names[@]}" -- "${rss[@]}" <<'EOF'
import json, sys, datetime
args = sys.argv[1:]
(gpucr_file, crit_file, image_size, pages_size, mib, cpu, cores, criu, runs, shown,
 load_before, load_after) = args[:12]
rest = args[12:]
sep = rest.index("--")
names, rss = rest[:sep], rest[sep + 1:]
results = json.load(open(gpucr_file))["results"] + json.load(open(crit_file))["results"]
crit_full, crit_x = results[2]["median"], results[3]["median"]
mi = lambda b: f"{int(b) / 2**20:.1f} MiB"
print("## gpucr inspect vs crit\n")
print(f"Measured {datetime.date.today()} by `scripts/bench-inspect.sh --mib {mib} --runs {runs}` "
      f"on {cores} cores ({cpu}), CRIU {criu}, release build, page cache warm; "
      f"1-minute load average {load_before} before and {load_after} after the timings.")
print(f"Image: the inspect test workload (4 processes, 9 threads, files, pipes, unix and TCP "
      f"sockets, a memfd) with a {mib} MiB region in its root, dumped by `gpucr dump`: "
      f"{mi(image_size)} in all, {mi(pages_size)} of pages files.\n")
print("Commands (hyperfine, median of %s runs after one warm-up; peak RSS from `/usr/bin/time -f %%M`):\n" % runs)
print("| command | median | min | max | peak RSS | speed-up vs crit (same information) | vs crit x only |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name, r, m in zip(names, results, rss):
    print(f"| {name} | {r['median'] * 1000:.1f} ms | {r['min'] * 1000:.1f} ms | "
          f"{r['max'] * 1000:.1f} ms | {int(m) / 1024:.1f} MiB | "
          f"{crit_full / r['median']:.1f}x | {crit_x / r['median']:.1f}x |")
print()
print(f"\"crit ... + crit show\" is what it takes crit to show what `gpucr inspect --all --json` "
      f"shows: the three explorers and `crit show` of the {shown} images gpucr reads "
      f"(one Python process each). `--verify` reads and hashes every byte of the image "
      f"({mi(image_size)}), which crit cannot do at all; its memory stays bounded because "
      f"pages files are hashed in 4 MiB blocks, never loaded whole.\n")
EOF
