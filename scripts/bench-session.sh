# Sourced by the benchmark scripts. On a machine shared with other work (builds), the
# measured commands run in a session of their own whose scheduler group gets nice
# $NICE (default -15; NICE=0 leaves it alone): with autogroup scheduling, other
# sessions' work then takes the cycles these commands leave instead of sharing the
# cores with them, whatever its own nice values.
NICE=${NICE:--15}

# Run the calling script again in a session of its own (once), with the same arguments.
bench_session_start() {
    if [ "$NICE" != 0 ] && [ -z "${GPUCR_BENCH_SESSION:-}" ]; then
        exec env GPUCR_BENCH_SESSION=1 setsid --wait "$0" "$@"
    fi
}

# Give this session's scheduler group nice $NICE.
bench_session_nice() {
    if [ "$NICE" != 0 ]; then
        echo "$NICE" >/proc/self/autogroup 2>/dev/null || echo "note: cannot set the session's nice" >&2
    fi
}

# The root of a tree started as `unshare --pid --fork ... &` (whose pid is UP): wait up
# to 60 s for unshare's child and the file READY the tree writes once it is ready, and
# print the child's pid; exit 1 naming WHAT if it did not start.
#   pid=$(tree_root_when_ready UP READY WHAT)
tree_root_when_ready() {
    local up=$1 ready=$2 what=$3 pid=""
    for _ in $(seq 1200); do
        pid=$(awk '{print $1}' "/proc/$up/task/$up/children" 2>/dev/null || true)
        [ -n "$pid" ] && [ -f "$ready" ] && break
        sleep 0.05
    done
    [ -f "$ready" ] || { echo "$what did not start" >&2; exit 1; }
    echo "$pid"
}
