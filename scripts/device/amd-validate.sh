#!/usr/bin/env bash
# Validate the amdgpu backend on a machine with AMD GPUs: the run the fake kernel of
# tests/amdgpu.rs cannot replace (docs/gpu-validation.md, "amdgpu").
#
#   scripts/device/amd-validate.sh
#
# It needs root, /dev/kfd, CRIU >= 4.2, and python3 with a ROCm build of PyTorch. It
# builds gpucr, starts a PyTorch process (in its own PID namespace) with tensors on every
# GPU, one of them above 4 GiB where a GPU has the memory, and then:
#  1. dumps it (the tree is killed by the dump) and checks the dump took the amdgpu path;
#  2. restores it with parallel restore, asks it to recompute every tensor checksum and
#     to run GPU work (a counter increment and a matmul on each GPU), and compares;
#  3. the same with --no-parallel-restore;
#  4. one restore per SDMA ring (GPUCR_AMDGPU_RINGS=N) and one on all rings, each verified,
#     reporting the GPU restore throughput of each.
# Everything lands in OUT (default: a new /var/tmp/gpucr-amd-validate.*): report.txt,
# the JSON of every gpucr run, the workload's checksums. Exit status 0 only when every
# restore verified.
#
# Settings: OUT, TENSOR_GIB (per GPU, default 6: one tensor of TENSOR_GIB - 1 GiB, so
# above 4 GiB, plus smaller ones; lowered to fit a GPU's free memory), MAX_RINGS (rings
# tried, default 8).
set -euo pipefail
trap 'printf "amd-validate: failed (exit status %s): %s\n" "$?" "$BASH_COMMAND" >&2' ERR
cd "$(dirname "$0")/../.."
root=$PWD
OUT=${OUT:-$(mktemp -d /var/tmp/gpucr-amd-validate.XXXXXX)}
TENSOR_GIB=${TENSOR_GIB:-6}
MAX_RINGS=${MAX_RINGS:-8}
mkdir -p "$OUT"
report=$OUT/report.txt
: >"$report"

say() { printf '%s\n' "$*" | tee -a "$report"; }
die() { say "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (CRIU needs it)"
[ -c /dev/kfd ] || die "no /dev/kfd: this machine has no AMD GPU driver loaded"
command -v criu >/dev/null || die "criu is not installed (scripts/install-criu.sh)"
python3 -c 'import torch, sys; sys.exit(0 if torch.version.hip and torch.cuda.is_available() else 1)' ||
    die "python3 has no ROCm PyTorch with a usable GPU"

cargo build --release --workspace --lib --bins
gpucr=$root/target/release/gpucr
say "gpucr: $($gpucr --version)"
say "criu: $(criu --version | head -1)"
say "kernel: $(uname -r)"
say "GPUs: $(python3 -c 'import torch; print(", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))')"
"$gpucr" check-topology | tee -a "$report"

# The workload: tensors on every GPU, their checksums on request, then GPU work.
cat >"$OUT/workload.py" <<'EOF'
import os, sys, time, torch
out, gib = sys.argv[1], int(sys.argv[2])
GIB = 1 << 30
tensors, counters = [], []
for d in range(torch.cuda.device_count()):
    dev = torch.device("cuda", d)
    free, _ = torch.cuda.mem_get_info(d)
    big = max(1, min(gib - 1, int(free * 0.6) // GIB))
    g = torch.Generator(device=dev).manual_seed(1000 + d)
    ts = [torch.randint(-2**31, 2**31 - 1, (big * GIB // 4,), dtype=torch.int32, device=dev, generator=g)]
    for n in (1, 4096, 3 << 20, 65 << 20):
        ts.append(torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, device=dev, generator=g))
    tensors.append(ts)
    counters.append(torch.zeros(1, dtype=torch.int64, device=dev))
torch.cuda.synchronize()

def checksums():
    lines = []
    for d, ts in enumerate(tensors):
        for i, t in enumerate(ts):
            s = t.to(torch.int64).sum().item()
            lines.append(f"gpu{d} tensor{i} bytes={t.numel() * 4} sum={s}")
    return "\n".join(lines) + "\n"

with open(os.path.join(out, "checksums.before"), "w") as f:
    f.write(checksums())
open(os.path.join(out, "ready"), "w").close()
n = 0
while True:
    req = os.path.join(out, "request")
    if not os.path.exists(req):
        time.sleep(0.05)
        continue
    os.unlink(req)
    n += 1
    with open(os.path.join(out, f"checksums.after.{n}"), "w") as f:
        f.write(checksums())
    work = []
    for d, c in enumerate(counters):
        c += 1
        a = torch.ones(512, 512, device=torch.device("cuda", d))
        work.append(f"gpu{d} counter={c.item()} matmul={(a @ a).sum().item()}")
    torch.cuda.synchronize()
    with open(os.path.join(out, f"verified.{n}"), "w") as f:
        f.write("\n".join(work) + "\n")
EOF

wait_for() { # FILE SECONDS
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        [ -e "$1" ] && return 0
        sleep 0.1
    done
    return 1
}

rm -f "$OUT/ready" "$OUT"/checksums.* "$OUT"/verified.* "$OUT/request"
unshare --pid --fork setsid python3 "$OUT/workload.py" "$OUT" "$TENSOR_GIB" \
    >"$OUT/workload.log" 2>&1 &
unshare_pid=$!
wait_for "$OUT/ready" 600 || die "the workload did not start (see $OUT/workload.log)"
pid=$(cat "/proc/$unshare_pid/task/$unshare_pid/children" | awk '{print $1}')
[ -n "$pid" ] || die "no workload process under unshare ($unshare_pid)"
say "workload: pid $pid, $(grep -c . "$OUT/checksums.before") tensors"

"$gpucr" dump --json "$pid" "$OUT/image" >"$OUT/dump.json"
python3 - "$OUT/dump.json" <<'EOF' | tee -a "$report"
import json, sys
d = json.load(open(sys.argv[1]))
g = d["gpu"]
assert g and g["backend"] == "amdgpu", f"not dumped by the amdgpu backend: {g}"
s = g["stats"]
print(f"dump: {s['raw_bytes'] / 2**30:.2f} GiB of GPU memory in {s['seconds']:.2f} s, "
      f"{s['raw_bytes'] / max(s['seconds'], 1e-9) / 1e9:.2f} GB/s, total {d['total_ms'] / 1e3:.2f} s")
EOF
wait "$unshare_pid" 2>/dev/null || true

n=0
# restore LABEL [gpucr restore flags...]: restore, verify, kill; prints the throughput.
# Returns 2 when gpucr cannot restore (its error in restore.N.err); a restored process
# that fails its checks ends the run.
restore() {
    local label=$1
    shift
    n=$((n + 1))
    local json=$OUT/restore.$n.json
    if ! "$gpucr" restore --detach --json "$@" "$OUT/image" >"$json" 2>"$OUT/restore.$n.err"; then
        say "$label: gpucr restore failed: $(tail -3 "$OUT/restore.$n.err")"
        return 2
    fi
    local rpid
    rpid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$json")
    touch "$OUT/request"
    if ! wait_for "$OUT/verified.1" 600; then
        kill -9 "$rpid" 2>/dev/null || true
        die "$label: the restored process did not answer (hung GPU work?)"
    fi
    mv "$OUT/verified.1" "$OUT/verified.$n"
    mv "$OUT/checksums.after.1" "$OUT/checksums.after.$n"
    kill -9 "$rpid" 2>/dev/null || true
    while kill -0 "$rpid" 2>/dev/null; do sleep 0.1; done
    cmp -s "$OUT/checksums.before" "$OUT/checksums.after.$n" ||
        die "$label: tensor checksums differ (diff $OUT/checksums.before $OUT/checksums.after.$n)"
    grep -q "counter=1 " "$OUT/verified.$n" ||
        die "$label: GPU work after the restore went wrong ($OUT/verified.$n)"
    python3 - "$json" "$label" <<'EOF' | tee -a "$report"
import json, sys
d = json.load(open(sys.argv[1]))
s = d["gpu"]["stats"]
print(f"{sys.argv[2]}: verified; {s['raw_bytes'] / 2**30:.2f} GiB, GPU part "
      f"{s['seconds']:.2f} s ({s['raw_bytes'] / max(s['seconds'], 1e-9) / 1e9:.2f} GB/s), "
      f"restore total {d['total_ms'] / 1e3:.2f} s")
EOF
}

restore "restore (parallel)" || die "the parallel restore failed"
restore "restore (--no-parallel-restore)" --no-parallel-restore ||
    die "the restore without parallel restore failed"
for ((r = 0; r < MAX_RINGS; r++)); do
    if ! GPUCR_AMDGPU_RINGS=$r restore "SDMA ring $r only" --no-parallel-restore; then
        grep -q "no SDMA ring" "$OUT/restore.$n.err" ||
            die "SDMA ring $r: the restore failed"
        say "SDMA ring $r: not offered by every GPU; $r rings measured"
        break
    fi
done
restore "SDMA all rings" --no-parallel-restore || die "the restore on all rings failed"
say "PASS: every restore verified; report in $report"
