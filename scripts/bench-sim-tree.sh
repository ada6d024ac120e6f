# shellcheck shell=bash
# Sourced, after bench-session.sh, by the benchmarks that run the simulator's GPU tree
# (bench-ready.sh, bench-migrate.sh).

# Start the GPU tree of WORKLOAD (examples/sim_workload.rs) with the options $SIM_TREE,
# its state in $WORK/state, in a PID namespace of its own, through the command words
# after WORKLOAD (such as `nsenter --net=...`; none: here). Wait until its parent is
# ready, then SETTLE seconds more, and write its root's pid to $WORK/pid.
#   start_sim_tree_through SETTLE WORKLOAD [COMMAND...]
start_sim_tree_through() {
    local settle=$1 workload=$2 pid
    shift 2
    rm -rf "$WORK/state" "$GPUCR_SIM_ROOT" && mkdir -p "$WORK/state"
    # shellcheck disable=SC2086 # the options, split
    "$@" unshare --pid --fork setsid "$workload" --state "$WORK/state" $SIM_TREE \
        </dev/null >/dev/null 2>&1 &
    pid=$(tree_root_when_ready $! "$WORK/state/ready-parent" "the GPU tree")
    sleep "$settle"
    echo "$pid" > "$WORK/pid"
}
