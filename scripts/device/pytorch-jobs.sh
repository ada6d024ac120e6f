#!/usr/bin/env bash
# Real PyTorch jobs checkpointed by gpucr, on an NVIDIA machine, from the repository
# root with .device/ carried (made by scripts/device/pack.sh on the build machine):
#
#   bash scripts/device/pytorch-jobs.sh
#
# 1. train: a transformer trained with AdamW under bf16 autocast, fed by a DataLoader
#    with 2 worker processes and pinned memory, all deterministic
#    (scripts/device/train_job.py), logging every step's loss as float.hex():
#    - a reference run of PAUSE_STEP + CONT_STEPS steps (default 20 + 50), uninterrupted;
#    - per FORKS entry (default "early late": the workers forked before or after CUDA
#      starts in the trainer), a second process that waits before step PAUSE_STEP;
#      its steps so far must equal the reference's (the control: the job is
#      deterministic across processes). `gpucr dump --leave-running` of the whole tree
#      (trainer + workers), then the job goes on: its CONT_STEPS losses must equal the
#      reference's bit for bit. It is killed, its image restored (`gpucr restore`), and
#      the restored job's CONT_STEPS losses must equal them too.
# 2. infer: an HTTP inference server on loopback (scripts/device/infer_server.py) with
#    MODEL_GIB (default 8) GiB of bf16 Linear layers on the GPU:
#    - cold start, process start to first answer, with the weights drawn on the GPU
#      (no weight I/O: the lower bound) and read from a checkpoint file in the page
#      cache (torch.load, mmap; as a server loads its weights);
#    - the file-loaded server, warmed up and answering, dumped by `gpucr dump`; then
#      RESTORES (default 2) times: `gpucr restore` to its first answer, against the
#      cold starts; every answer's digest (same input) must equal the first server's.
#
# Workloads start as plain processes (setsid), not in a PID namespace: CUDA does not
# start in one that shares the host's /proc (docs/gpu-validation.md), so each restore
# needs its pids free again, which the kills wait for. Every wait and command has a
# time limit, and the run skips what cannot finish before DEADLINE seconds (default
# 540) from its start; every process started is killed on exit. The results block at
# the end (markdown) is for docs/gpu-validation.md; the log goes to $OUT/pytorch-jobs.log,
# gpucr's output and the CRIU logs of failed steps to $OUT/pytorch-jobs-details.tgz.
# Exit status 0 when every check passed.
#
# Settings: JOBS ("train infer"), FORKS, PAUSE_STEP, CONT_STEPS, MODEL_GIB, RESTORES,
# WAIT_TIMEOUT (120 s per wait), DEADLINE, DEVICE (cuda; cpu runs tiny models on the
# CPU, where gpucr dumps CPU trees: the same flow without a GPU), GPUCR (a gpucr binary
# to use instead of .device's, with CRIU from PATH: a run on the build machine).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
dev=$root/.device
here=$root/scripts/device
out=${OUT:-$root/pytorch-jobs-out}
mkdir -p "$out"
exec > >(tee -a "$out/pytorch-jobs.log") 2>&1

JOBS=${JOBS:-train infer}
FORKS=${FORKS:-early late}
PAUSE_STEP=${PAUSE_STEP:-20}
CONT_STEPS=${CONT_STEPS:-50}
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cuda ]; then MODEL_GIB=${MODEL_GIB:-8}; else MODEL_GIB=${MODEL_GIB:-0.0625}; fi
RESTORES=${RESTORES:-2}
WAIT_TIMEOUT=${WAIT_TIMEOUT:-120}
DEADLINE=${DEADLINE:-540}
export CUBLAS_WORKSPACE_CONFIG=:4096:8
total_steps=$((PAUSE_STEP + CONT_STEPS))

# Images and state on disk (/var/tmp), removed at the end.
work=$(mktemp -d /var/tmp/gpucr-pytorch-jobs.XXXXXX)
details=$work/details
mkdir -p "$details"
results=$work/results.md
passed=0 failed=0

# --- bookkeeping ------------------------------------------------------------------------
started=()  # every job's pid: each leads its process group, a restored one too
cleanup() {
    local g
    trap '' PIPE  # the log's tee may be gone (a signal to the whole group)
    for g in ${started[@]+"${started[@]}"}; do
        kill -KILL -- "-$g" 2>/dev/null
        kill -KILL "$g" 2>/dev/null
    done
    tar czf "$out/pytorch-jobs-details.tgz" -C "$work" details 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

section() { echo; echo "=== $*"; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
row() {
    local line
    line=$(printf '| %s | %s |' "$1" "${2//|//}")
    echo "$line" >> "$results"
    echo "RESULT $line"
}
pass() { passed=$((passed + 1)); row "$1" "PASS: $2"; }
fail() { failed=$((failed + 1)); row "$1" "**FAIL**: $2"; }
info() { row "$1" "$2"; }
# SECS, or fewer so that the run ends by DEADLINE (at least 10).
cap() {
    local left=$((DEADLINE - SECONDS))
    [ "$left" -lt 10 ] && left=10
    if [ "$1" -lt "$left" ]; then echo "$1"; else echo "$left"; fi
}
limit() { local secs; secs=$(cap "$1"); shift; timeout --kill-after=10 "$secs" "$@"; }
# Whether NEED more seconds fit before the deadline; else NAME is recorded as skipped.
fits() {
    if [ $((SECONDS + $1)) -le "$DEADLINE" ]; then return 0; fi
    info "$2" "not run: ${1} s more would pass the deadline (${DEADLINE} s, ${SECONDS} s gone)"
    return 1
}
alive() {
    local s
    s=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
    case $s in Z*) return 1 ;; esac
}
# Kill the tree led by PID (its process group) and wait up to 30 s until its pids are
# free again (reaping it when it is this shell's child): a restore needs them.
kill_tree() {
    [ -n "${1:-}" ] || return 0
    kill -KILL -- "-$1" 2>/dev/null
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    for _ in $(seq 300); do
        [ -d "/proc/$1" ] || [ -n "$(pgrep -g "$1")" ] || break
        sleep 0.1
    done
}
# Wait up to SECS for FILE; give up early when PID is gone or STATE has an error file.
wait_file() {
    local file=$1 secs pid=$3 state=$4 end
    secs=$(cap "$2")
    end=$((SECONDS + secs))
    while [ ! -e "$file" ]; do
        if [ -n "$(ls "$state"/error* 2>/dev/null)" ]; then
            echo "error in $state:"; tail -15 "$state"/error*; return 1
        fi
        if ! alive "$pid"; then
            [ -e "$file" ] && return 0  # written just before the process ended
            echo "process $pid is gone"; return 1
        fi
        if [ "$SECONDS" -ge "$end" ]; then echo "no $file after $secs s"; return 1; fi
        sleep 0.05
    done
}
jget() { python3 -c 'import json, sys; v = json.loads(sys.argv[1]).get(sys.argv[2]); print("" if v is None else v)' "$1" "$2"; }
# The details of a failed gpucr command: its output and CRIU's log.
keep_logs() {
    local name=$1 img=$2
    tail -20 "$details/$name.txt"
    cp "$img/dump.log" "$details/$name-dump.log" 2>/dev/null
    cp "$img/restore.log" "$details/$name-restore.log" 2>/dev/null
    grep -hE 'Error|gpucr: error' "$img/dump.log" "$img/restore.log" 2>/dev/null | tail -5
}
oneline() { tr '\n' ' ' < "$1" | sed 's/|/\//g' | cut -c1-300; }

# --- the carried build ------------------------------------------------------------------
if [ -n "${GPUCR:-}" ]; then
    gpucr=$GPUCR
elif [ -x "$dev/bin/gpucr" ]; then
    gpucr=$dev/bin/gpucr
    export GPUCR_PLUGIN=$dev/lib/libgpucr_plugin.so
    # CRIU's own libraries (Debian 12's) for CRIU alone; Python keeps the machine's.
    source "$root/scripts/device/carried-criu.sh"
    use_carried_criu "$dev" "$work"
else
    echo "no $dev/bin/gpucr: run scripts/device/pack.sh on the build machine and carry .device (or set GPUCR)" >&2
    exit 1
fi
# The driver library, where the dynamic loader does not find it by itself.
if [ "$DEVICE" = cuda ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/local/cuda/compat; do
        if [ -e "$d/libcuda.so.1" ]; then
            export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            break
        fi
    done
fi
# The trainer's DataLoader hands batches over through unlinked /dev/shm files, which
# CRIU dumps as ghost files: room for them.
criu_conf=$work/criu.conf
echo "ghost-limit 64M" > "$criu_conf"

section "machine"
info "date" "$(date -u '+%Y-%m-%d %H:%M UTC')"
info "machine" "$(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r)"
if [ "$DEVICE" = cuda ]; then
    info "gpu" "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
fi
info "pytorch" "$(python3 -c 'import sys, torch; print(torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])' 2>&1 | tail -1)"
info "gpucr" "$("$gpucr" --version 2>&1 | head -1); $(paste -sd ',' "$dev/VERSIONS" 2>/dev/null | sed 's/,/, /g')"
info "settings" "DEVICE=$DEVICE PAUSE_STEP=$PAUSE_STEP CONT_STEPS=$CONT_STEPS FORKS='$FORKS' MODEL_GIB=$MODEL_GIB RESTORES=$RESTORES"

# --- 1. training ------------------------------------------------------------------------
# Start a trainer: STATE TAG PAUSE_AT FORK LINGER; sets job.
start_trainer() {
    setsid python3 "$here/train_job.py" --device "$DEVICE" --state "$1" --tag "$2" \
        --steps "$total_steps" --pause-at "$3" --fork "$4" --linger "$5" \
        </dev/null >/dev/null 2>&1 &
    job=$!
    started+=("$job")
}
# Compare the losses of steps FIRST.. (COUNT of them) in FILE with the reference's;
# prints what it found, exit status 0 when all are bit-identical.
compare_losses() {
    python3 - "$ref_losses" "$1" "$2" "$3" <<'PY'
import sys
def read(path):
    steps = {}
    try:
        for line in open(path):
            step, value = line.split()
            steps.setdefault(int(step), []).append(value)
    except FileNotFoundError:
        pass
    return steps
ref, got = read(sys.argv[1]), read(sys.argv[2])
first, count = int(sys.argv[3]), int(sys.argv[4])
want = range(first, first + count)
missing = [s for s in want if s not in got]
twice = [s for s in want if len(got.get(s, [])) > 1]
differ = [s for s in want if s in got and got[s][0] != ref.get(s, [None])[0]]
extra = sorted(set(got) - set(want))
if missing or twice or differ or extra:
    what = []
    if differ:
        s = differ[0]
        what.append(f"{len(differ)} differ, first at step {s}: {got[s][0]} against {ref.get(s, ['none'])[0]}")
    if missing:
        what.append(f"{len(missing)} missing (from step {missing[0]})")
    if twice:
        what.append(f"{len(twice)} logged twice")
    if extra:
        what.append(f"unexpected steps {extra[:5]}")
    print("; ".join(what))
    sys.exit(1)
print(f"{count}/{count} losses bit-identical (steps {first}-{first + count - 1}; "
      f"step {first}: {ref[first][0]})")
PY
}
# Release the paused trainer in STATE: its remaining steps log under TAG.
release() { echo "$2" > "$1/go.tmp" && mv "$1/go.tmp" "$1/go"; }

# One trainer, dumped at PAUSE_STEP with --leave-running, run on, killed, restored.
train_fork() {
    local fork=$1 state=$work/train-$1 img=$work/img-train-$1 pid t ms d restored dumped=0
    local name="train ($fork fork)"
    section "$name: paused at step $PAUSE_STEP, dump --leave-running, run on, kill, restore"
    mkdir -p "$state"
    start_trainer "$state" pre "$PAUSE_STEP" "$fork" 600
    pid=$job
    if ! d=$(wait_file "$state/paused" "$WAIT_TIMEOUT" "$pid" "$state"); then
        echo "$d"; fail "$name: reach step $PAUSE_STEP" "$(echo "$d" | tail -3 | tr '\n' ' ' | cut -c1-300)"
        kill_tree "$pid"; return
    fi
    if d=$(compare_losses "$state/losses-pre.txt" 0 "$PAUSE_STEP"); then
        pass "$name: steps 0-$((PAUSE_STEP - 1)), a second process against the reference" "$d"
    else
        fail "$name: steps 0-$((PAUSE_STEP - 1)), a second process against the reference" "$d"
    fi
    info "$name: the tree at the dump" "$(ps -o pid=,ppid=,comm= -p "$(pgrep -g "$pid" | paste -sd,)" 2>/dev/null |
        awk '{printf "%s%s %s (parent %s)", (NR > 1 ? ", " : ""), $3, $1, $2}')"
    # What each process of the tree maps and holds open of the driver (a worker that
    # inherited a device mapping is what CRIU cannot dump without a plugin claiming it).
    local p
    for p in $(pgrep -g "$pid"); do
        cat "/proc/$p/maps" > "$details/maps-train-$fork-$p.txt" 2>/dev/null
        ls -l "/proc/$p/fd" > "$details/fds-train-$fork-$p.txt" 2>/dev/null
        info "$name: pid $p maps of devices" "$(grep -E ' /dev/' "/proc/$p/maps" 2>/dev/null |
            awk '{print $1, $2, $6}' | sort -k3 | awk '{a[$3]++; r[$3]=r[$3] " " $1 " " $2} END {for (f in a) printf "%s x%d:%s; ", f, a[f], substr(r[f], 1, 120)}')"
    done
    t=$(date +%s%N)
    if limit 300 "$gpucr" dump --leave-running --criu-config "$criu_conf" "$pid" "$img" \
            > "$details/dump-train-$fork.txt" 2>&1; then
        ms=$(ms_since "$t")
        dumped=1
        pass "$name: gpucr dump --leave-running at step $PAUSE_STEP" "$ms ms, image $(du -sh "$img" | cut -f1)"
    else
        keep_logs "dump-train-$fork" "$img"
        fail "$name: gpucr dump --leave-running at step $PAUSE_STEP" "$(oneline "$details/dump-train-$fork.txt")"
    fi
    release "$state" leave
    if d=$(wait_file "$state/done-leave" "$WAIT_TIMEOUT" "$pid" "$state") &&
        d=$(compare_losses "$state/losses-leave.txt" "$PAUSE_STEP" "$CONT_STEPS"); then
        pass "$name: the job left running, steps $PAUSE_STEP-$((total_steps - 1))" "$d; $(cat "$state/done-leave")"
    else
        fail "$name: the job left running, steps $PAUSE_STEP-$((total_steps - 1))" "$(echo "$d" | tail -3 | tr '\n' ' ' | cut -c1-300)"
    fi
    kill_tree "$pid"
    if [ "$dumped" = 0 ]; then rm -rf "$img"; return; fi
    release "$state" restored
    t=$(date +%s%N)
    if ! restored=$(limit 300 "$gpucr" restore --detach "$img" 2> "$details/restore-train-$fork.txt"); then
        keep_logs "restore-train-$fork" "$img"
        fail "$name: gpucr restore (the job killed)" "$(oneline "$details/restore-train-$fork.txt")"
        kill_tree "$pid"  # whatever a failed restore left has the job's pids
        rm -rf "$img"; return
    fi
    ms=$(ms_since "$t")
    started+=("$restored")
    info "$name: gpucr restore" "$ms ms (root pid $restored, was $pid)"
    if d=$(wait_file "$state/done-restored" "$WAIT_TIMEOUT" "$restored" "$state") &&
        d=$(compare_losses "$state/losses-restored.txt" "$PAUSE_STEP" "$CONT_STEPS"); then
        pass "$name: the restored job, steps $PAUSE_STEP-$((total_steps - 1))" "$d; $(cat "$state/done-restored")"
        # The same weights at the end as the job that ran on.
        if [ "$(jget "$(cat "$state/done-restored")" params)" = "$(jget "$(cat "$state/done-leave" 2>/dev/null || echo '{}')" params)" ]; then
            pass "$name: parameters after the last step, restored against left running" "digests equal"
        else
            fail "$name: parameters after the last step, restored against left running" "digests differ"
        fi
    else
        fail "$name: the restored job, steps $PAUSE_STEP-$((total_steps - 1))" "$(echo "$d" | tail -3 | tr '\n' ' ' | cut -c1-300)"
    fi
    kill_tree "$restored"
    rm -rf "$img"
}

# Time kept for the inference job when both run.
infer_reserve=0
[[ " $JOBS " == *" infer "* ]] && infer_reserve=150
if [[ " $JOBS " == *" train "* ]] && fits 60 "train: reference run"; then
    section "train: reference run, $total_steps steps"
    state=$work/train-ref
    ref_losses=$state/losses-ref.txt
    mkdir -p "$state"
    t=$(date +%s%N)
    start_trainer "$state" ref -1 early 0
    pid=$job
    if d=$(wait_file "$state/done-ref" "$((WAIT_TIMEOUT * 2))" "$pid" "$state"); then
        info "train: reference run" "$total_steps steps in $(ms_since "$t") ms (process start to last step); $(cat "$state/done-ref")"
        for _ in $(seq 300); do alive "$pid" || break; sleep 0.1; done
        alive "$pid" && fail "train: reference run" "the job did not exit after its last step"
        kill_tree "$pid"
        for fork in $FORKS; do
            fits $((90 + infer_reserve)) "train ($fork fork)" && train_fork "$fork"
        done
    else
        echo "$d"
        fail "train: reference run" "$(echo "$d" | tail -3 | tr '\n' ' ' | cut -c1-300)"
        kill_tree "$pid"
    fi
fi

# --- 2. inference -----------------------------------------------------------------------
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
client() { python3 "$here/infer_client.py" "$@"; }
# Start a server: STATE PORT INIT; sets job.
start_server() {
    setsid python3 "$here/infer_server.py" --device "$DEVICE" --state "$1" --port "$2" \
        --gib "$MODEL_GIB" --init "$3" --weights "$weights" </dev/null >/dev/null 2>&1 &
    job=$!
    started+=("$job")
}
# Start a server (INIT) and wait for its first answer; sets cold_ms, answer, job.
cold_start() {
    local init=$1 state=$work/infer-$1 port t
    mkdir -p "$state"
    port=$(free_port)
    t=$(date +%s%N)
    start_server "$state" "$port" "$init"
    answer=$(client --port "$port" --seed 7 --timeout "$(cap "$WAIT_TIMEOUT")" --pid "$job")
    local rc=$?
    cold_ms=$(ms_since "$t")
    server_port=$port
    if [ $rc != 0 ]; then
        echo "$answer"; tail -15 "$state"/error* 2>/dev/null
        fail "infer: cold start ($init)" "no answer: $answer $(tail -1 "$state"/error* 2>/dev/null)"
        return 1
    fi
    info "infer: cold start ($init), process start to first answer" "$cold_ms ms; phases (s since the interpreter started): $(jget "$(cat "$state/ready")" phases); $(jget "$(cat "$state/ready")" layers) layers, $(jget "$(cat "$state/ready")" gib) GiB"
}

if [[ " $JOBS " == *" infer "* ]] && fits 150 "infer"; then
    section "infer: $MODEL_GIB GiB server"
    weights=$work/weights.pt
    mkdir -p "$work/infer-save"
    t=$(date +%s%N)
    if limit 300 python3 "$here/infer_server.py" --device "$DEVICE" --gib "$MODEL_GIB" \
            --state "$work/infer-save" --save-weights "$weights" > "$details/save-weights.txt" 2>&1; then
        info "infer: checkpoint file written (not timed in any start)" "$(du -sh "$weights" | cut -f1) in $(ms_since "$t") ms"
    else
        fail "infer: checkpoint file" "$(tail -3 "$details/save-weights.txt" | tr '\n' ' ')"
    fi
    digest_device="" digest_file=""
    if cold_start device; then
        digest_device=$(jget "$answer" digest)
        cold_device_ms=$cold_ms
    fi
    kill_tree "$job"
    if [ -f "$weights" ] && cold_start file; then
        pid=$job port=$server_port cold_file_ms=$cold_ms
        digest_file=$(jget "$answer" digest)
        if [ -n "$digest_device" ]; then
            if [ "$digest_file" = "$digest_device" ]; then
                pass "infer: weights drawn on the GPU and read from the file answer alike" "digest ${digest_file:0:16}"
            else
                fail "infer: weights drawn on the GPU and read from the file answer alike" "${digest_file:0:16} against ${digest_device:0:16}"
            fi
        fi
        warm=$(client --port "$port" --seed 7 --count 5 --timeout 60)
        info "infer: warm answers before the dump (round trip)" "$(jget "$warm" latencies_ms) ms; same digest: $(jget "$warm" same)"
        img=$work/img-infer
        t=$(date +%s%N)
        if limit 300 "$gpucr" dump "$pid" "$img" > "$details/dump-infer.txt" 2>&1; then
            pass "infer: gpucr dump of the warmed-up server" "$(ms_since "$t") ms, image $(du -sh "$img" | cut -f1)"
            kill_tree "$pid"
            for r in $(seq "$RESTORES"); do
                fits 40 "infer: restore $r" || break
                t=$(date +%s%N)
                if ! restored=$(limit 300 "$gpucr" restore --detach "$img" 2> "$details/restore-infer-$r.txt"); then
                    keep_logs "restore-infer-$r" "$img"
                    fail "infer: gpucr restore $r" "$(oneline "$details/restore-infer-$r.txt")"
                    kill_tree "$pid"  # whatever a failed restore left has the server's pid
                    break
                fi
                restore_ms=$(ms_since "$t")
                started+=("$restored")
                answer=$(client --port "$port" --seed 7 --timeout "$(cap "$WAIT_TIMEOUT")" --pid "$restored")
                first_ms=$(ms_since "$t")
                d=$(jget "$answer" digest)
                if [ -z "$d" ]; then
                    fail "infer: restore $r, first answer" "none: $answer"
                else
                    ratio=$(python3 -c "import sys; c, f, r = map(float, sys.argv[1:]); print(f'cold start (file) / restore {c / r:.2f}, cold start (GPU-drawn) / restore {f / r:.2f}')" "$cold_file_ms" "${cold_device_ms:-0}" "$first_ms")
                    info "infer: restore $r, gpucr restore to first answer" "$first_ms ms (gpucr restore $restore_ms ms); $ratio"
                    if [ "$d" = "$digest_file" ]; then
                        pass "infer: restore $r, answer equals the original server's" "digest ${d:0:16}, served count $(jget "$answer" served) (the original's was 6 at the dump)"
                    else
                        fail "infer: restore $r, answer equals the original server's" "${d:0:16} against ${digest_file:0:16}"
                    fi
                    warm=$(client --port "$port" --seed 7 --count 5 --timeout 60)
                    info "infer: restore $r, warm answers after (round trip)" "$(jget "$warm" latencies_ms) ms; same digest: $(jget "$warm" same)"
                fi
                kill_tree "$restored"
            done
        else
            keep_logs dump-infer "$img"
            fail "infer: gpucr dump of the warmed-up server" "$(oneline "$details/dump-infer.txt")"
            kill_tree "$pid"
        fi
        rm -rf "$img"
    else
        kill_tree "$job"
    fi
fi

section "results (for docs/gpu-validation.md)"
echo "| check | result |"
echo "|---|---|"
cat "$results"
echo "passed $passed, failed $failed, $SECONDS s"
cp "$results" "$out/pytorch-jobs-results.md"
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
