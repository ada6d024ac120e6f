#!/usr/bin/env bash
# gpucr's main job on the bundled sample workload, from a fresh machine:
# set everything up, start the workload tree in its own PID namespace, dump it (which
# kills it), inspect the image, restore it, and show that it carried on where it was.
#
#   scripts/demo.sh [--memory-mib N]      (as root; default 256)
set -euo pipefail
trap 'printf "demo: failed (exit status %s): %s\n" "$?" "$BASH_COMMAND" >&2' ERR
cd "$(dirname "$0")/.."

memory_mib=256
if [ "${1:-}" = "--memory-mib" ]; then memory_mib=${2:?}; fi

scripts/setup.sh

gpucr=target/release/gpucr
workload=target/release/examples/workload
work=$(mktemp -d /tmp/gpucr-demo.XXXXXX)
state=$work/state
image=$work/image
mkdir -p "$state"
restored=""
unshare_pid=""
cleanup() {
    [ -n "$restored" ] && kill -KILL "$restored" 2>/dev/null || true
    [ -n "$unshare_pid" ] && kill -KILL "$unshare_pid" 2>/dev/null || true
    [ -n "${root:-}" ] && kill -KILL "$root" 2>/dev/null || true
}
trap cleanup EXIT

say() { printf '\n== %s\n' "$*"; }
last_ticks() {
    for role in parent tcp pipe; do
        printf '   %-7s %s\n' "$role" "$(tail -n 1 "$state/journal-$role")"
    done
}

say "starting the sample workload ($memory_mib MiB pattern, 3 processes, pipe, socketpair, TCP, memfd)"
unshare --pid --fork setsid "$workload" --state "$state" --memory-mib "$memory_mib" \
    </dev/null >/dev/null 2>&1 &
unshare_pid=$!
for _ in $(seq 200); do
    root=$(cat "/proc/$unshare_pid/task/$unshare_pid/children" 2>/dev/null | awk '{print $1}')
    [ -n "$root" ] && [ -f "$state/ready" ] && break
    sleep 0.1
done
[ -f "$state/ready" ] || { echo "the workload did not start" >&2; exit 1; }
sleep 1
echo "   root pid $root"
last_ticks

say "gpucr dump --tcp-established $root $image"
"$gpucr" dump --tcp-established "$root" "$image"
for _ in $(seq 100); do [ -d "/proc/$root" ] || break; sleep 0.1; done
if [ -d "/proc/$root" ]; then echo "   the tree is still there?" >&2; else echo "   the tree is gone (dump kills it)"; fi
before=$(tail -n 1 "$state/journal-parent" | sed 's/ .*//')

if "$gpucr" inspect --help >/dev/null 2>&1 && "$gpucr" inspect "$image" >/dev/null 2>&1; then
    say "gpucr inspect $image"
    "$gpucr" inspect --ps-tree-cmd "$image" || true
fi

say "gpucr restore --detach $image"
restored=$("$gpucr" restore --detach "$image")
echo "   restored root pid $restored"
sleep 2
last_ticks
after=$(tail -n 1 "$state/journal-parent" | sed 's/ .*//')

say "result"
lines=$(wc -l < "$state/journal-parent")
if awk -F'[ =]' '{ if ($2 != NR) bad=1; if ($0 ~ /BAD/) bad=1 } END { exit bad }' "$state/journal-parent"; then
    echo "   journal-parent: $lines consecutive ticks, $before at the dump, $after now; every check ok"
    echo "   the restored tree carried on from where it was"
else
    echo "   journal-parent is broken: the restore lost something" >&2
    exit 1
fi
