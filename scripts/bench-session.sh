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
